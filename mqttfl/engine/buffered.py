"""Buffered asynchronous aggregation: FedBuff (Nguyen et al., AISTATS 2022) as a mode of
the round engine, not a second loop (``federation.mode = "buffered"``).

Versions are the engine's rounds: version v is what round v's close publishes, and round
t = v+1 is open while clients train on version v. Every round start selects the live
clients; one still training on an older version finishes first and then takes the
newest start it holds (:mod:`mqttfl.nodes.client` skips the older ones), so clients
train continuously on the latest version they hold, each at its own speed. An upload of
round u that arrives while round t is open is τ = t - u versions stale; the gate
(:class:`BufferGate`) takes any u with τ ≤ ``max_staleness`` into the buffer and refuses
older ones (reason ``too_stale``, logged ``upload.rejected``). Round t closes as soon as
the buffer holds ``buffer_size`` uploads (fewer only if fewer clients are live, or at the
round's deadline), which publishes version t.

Each upload counts with s(τ) (:func:`staleness_weight`): FedBuff's 1/sqrt(1+τ) (Nguyen et
al. 2022, Sec. 5, "staleness scaling"), or FedAsync's polynomial (1+τ)^-a (Xie et al.
2019, Sec. 5.2), or 1.

How an upload counts in version t is the method's, by family
(:class:`~mqttfl.algorithms.base.ServerSide`). A method whose upload is a model has it
moved onto the current version once (its ``rebase``, from what its ``version`` kept of
the published versions: FedBuff's θ^(t-1) + s(τ)·Δ, :class:`~mqttfl.algorithms.common.
weights.ModelVersions`). A method whose upload is a set it aggregates ``keeps_latest``:
the engine keeps each client's newest upload with the round it was trained in, and
every close aggregates the newest of every client within ``max_staleness`` (not only
the buffer's), each with its s(τ) passed to the method's ``aggregate`` as
``staleness``.

Crash-resume: the version counter is the run state's ``round``; the buffer, the latest
sets and the version history ride in the checkpoint (``RunState.buffered``), which the
engine asks to be written after every accepted upload (:class:`Keep`) as well as at
every close.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mqttfl.algorithms.base import Upload
from mqttfl.config import FederationConfig, RunConfig
from mqttfl.engine.actions import Action, Close, Keep, Phase
from mqttfl.engine.aggregate import aggregate_checked
from mqttfl.engine.documents import BufferedBlock, RunSummary
from mqttfl.engine.gate import UploadGate
from mqttfl.engine.rounds import RoundEngine
from mqttfl.errors import DataError, WireError
from mqttfl.wire.downlinks import encode_downlinks
from mqttfl.wire.ids import client_order
from mqttfl.wire.schemas import ClientInfo

__all__ = ["BufferGate", "BufferedEngine", "Keep", "engine_for", "staleness_weight"]


def staleness_weight(tau: int, fed: FederationConfig) -> float:
    """s(τ) of ``federation.staleness_weighting`` (see the module docstring)."""
    if tau < 0:
        raise ValueError(f"staleness {tau} < 0")
    if fed.staleness_weighting == "fedbuff":
        return 1.0 / math.sqrt(1.0 + tau)
    if fed.staleness_weighting == "polynomial":
        return float((1.0 + tau) ** -fed.staleness_exponent)
    return 1.0


@dataclass(frozen=True)
class Entry:
    round: int  # the round the upload was trained for (on version round - 1)
    upload: Upload
    bytes: int


@dataclass
class BufferGate(UploadGate):
    """The upload gate of buffered mode: uploads of any of the last ``max_staleness``+1
    rounds, each (round, client) once, from a client selected in that round, and at most
    one entry per client in the buffer: a newer upload replaces its sender's entry, an
    older one is refused (``superseded``), so that no one client can fill the buffer and
    close a version alone."""

    max_staleness: int = 0
    entries: dict[tuple[int, str], Entry] = field(default_factory=dict)  # the buffer
    asked: dict[int, frozenset[str]] = field(default_factory=dict)  # selected, per round
    taken: set[tuple[int, str]] = field(default_factory=set)  # aggregated already
    ended: bool = False  # after the last version: nothing more is taken

    def current(self) -> int:
        """The round an upload's staleness is counted from (the next one while closed)."""
        return self.round if self.open else self.round + 1

    def open_round(self, t: int, selected: list[str], *, keep: bool) -> None:
        self.round, self.open = t, True
        self.asked[t] = frozenset(selected) | self.asked.get(t, frozenset())
        self.selected = self.asked[t]
        low = t - self.max_staleness
        self.asked = {u: s for u, s in self.asked.items() if u >= low}
        self.taken = {k for k in self.taken if k[0] >= low}
        self.accepted = {c: e.upload for (u, c), e in self.entries.items() if u == t}
        self.accepted_bytes = {c: e.bytes for (u, c), e in self.entries.items() if u == t}

    def close_buffer(self) -> list[Entry]:
        self.open = False
        entries = sorted(
            self.entries.values(), key=lambda e: (e.round, client_order(e.upload.client_id))
        )
        self.taken |= set(self.entries)
        self.entries = {}
        return entries

    def _screen(self, t: int, client: str, size: int) -> None:
        if size > self.max_bytes:
            raise WireError("oversize", f"{size} bytes exceeds the limit of {self.max_bytes}")
        if self.ended:
            raise WireError("stale", f"upload for round {t} after the last version")
        if t > self.round:
            raise WireError("future", f"upload for round {t} while round {self.round} is newest")
        staleness = self.current() - t
        if staleness > self.max_staleness:
            raise WireError(
                "too_stale",
                f"upload for round {t} is {staleness} versions old "
                f"(federation.max_staleness={self.max_staleness})",
            )
        if (t, client) in self.entries or (t, client) in self.taken:
            raise WireError("duplicate", f"client {client!r} already uploaded for round {t}")
        held = self.entry_of(client)
        if held is not None and held.round > t:
            raise WireError(
                "superseded",
                f"client {client!r} has an upload of round {held.round} in the buffer",
            )

    def entry_of(self, client: str) -> Entry | None:
        """``client``'s entry in the buffer (at most one)."""
        return next((e for (_, c), e in self.entries.items() if c == client), None)

    def was_selected(self, t: int, client: str) -> bool:
        return client in self.asked.get(t, frozenset())

    def _take(self, t: int, upload: Upload, size: int) -> None:
        client = upload.client_id
        replaced = self.entry_of(client)
        if replaced is not None:  # its older upload: never counted, never taken again
            key = (replaced.round, client)
            del self.entries[key]
            self.taken.add(key)
            self.accepted.pop(client, None)
            self.accepted_bytes.pop(client, None)
        self.entries[(t, client)] = Entry(t, upload, size)
        if t == self.round:
            self.accepted[client] = upload
            self.accepted_bytes[client] = size


def _info_dict(info: ClientInfo) -> dict[str, object]:
    return asdict(info)


def _info(data: dict[str, Any]) -> ClientInfo:
    return ClientInfo(
        client_id=str(data["client_id"]),
        arch=str(data["arch"]),
        classes=tuple(int(c) for c in data["classes"]),
        num_samples=int(data["num_samples"]),
        sample_shape=tuple(int(s) for s in data["sample_shape"]),
        site=str(data.get("site", "")),
    )


def _entry_dict(entry: Entry) -> dict[str, object]:
    upload = entry.upload
    return {
        "round": entry.round,
        "client": upload.client_id,
        "info": _info_dict(upload.info),
        "body": upload.body,
        "bytes": entry.bytes,
    }


def _entry(data: dict[str, Any]) -> Entry:
    info = _info(data["info"])
    upload = Upload(str(data["client"]), info, dict(data["body"]))
    return Entry(int(data["round"]), upload, int(data["bytes"]))


class BufferedEngine(RoundEngine):
    """The round engine in buffered mode: the same phases and events, with the buffer's
    gate, its own close (staleness-weighted) and a checkpoint after every upload."""

    gate: BufferGate
    # version -> what the method kept of it to rebase later uploads on (its `version`)
    versions: dict[int, dict[str, np.ndarray]]
    latest: dict[str, Entry]  # client -> its newest upload (a method that keeps_latest)
    staleness: Counter[int]  # τ of every aggregated upload
    client_staleness: dict[str, int]  # τ of each client's newest upload
    dirty: bool  # the buffer changed since the last checkpoint

    def _gate_type(self) -> type[UploadGate]:
        return BufferGate

    @property
    def buffer(self) -> BufferGate:
        return self.gate

    def _start_mode(self) -> None:
        self.gate.round, self.gate.max_staleness = self.state.round, self.fed.max_staleness
        self.versions, self.latest = {}, {}
        self.staleness, self.client_staleness = Counter(), {}
        self.dirty = False
        try:
            self._restore(self.state.buffered)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError("checkpoint", f"its buffered state does not load: {exc}") from None
        self.buffer.ended = self.round > self.config.rounds

    # --- the checkpoint --------------------------------------------------------------------
    def _restore(self, saved: dict[str, Any]) -> None:
        if not saved:
            return
        for entry in map(_entry, saved["buffer"]):
            self.buffer.entries[(entry.round, entry.upload.client_id)] = entry
        self.latest = {e.upload.client_id: e for e in map(_entry, saved["latest"])}
        self.versions = {
            int(v): {str(k): np.asarray(w) for k, w in groups.items()}
            for v, groups in saved["versions"].items()
        }
        self.buffer.asked = {int(u): frozenset(map(str, c)) for u, c in saved["asked"].items()}
        self.buffer.taken = {(int(u), str(c)) for u, c in saved["taken"]}
        self.staleness = Counter({int(k): int(n) for k, n in saved["staleness"].items()})
        self.client_staleness = {str(c): int(s) for c, s in saved["client_staleness"].items()}

    def _saved(self) -> dict[str, object]:
        return {
            "buffer": [_entry_dict(e) for e in self.buffer.entries.values()],
            "latest": [_entry_dict(e) for e in self.latest.values()],
            "versions": {v: dict(groups) for v, groups in self.versions.items()},
            "asked": {u: sorted(c, key=client_order) for u, c in self.buffer.asked.items()},
            "taken": sorted([u, c] for u, c in self.buffer.taken),
            "staleness": dict(self.staleness),
            "client_staleness": dict(self.client_staleness),
        }

    def checkpoint(self) -> dict[str, object]:
        self.state.buffered = self._saved()
        return self.state.to_dict(self.config)

    # --- events ------------------------------------------------------------------------
    def on_upload(self, t: int, client: str, raw: bytes, wire_bytes: int = -1) -> Upload | None:
        upload = super().on_upload(t, client, raw, wire_bytes)
        if upload is None:
            return None
        self.client_staleness[client] = self.buffer.current() - t
        self.dirty = True
        return upload

    def step(self) -> list[Action]:
        actions = super().step()
        if self.dirty and not any(isinstance(a, Close) for a in actions):
            actions.append(Keep(self.checkpoint()))
        self.dirty = False
        return actions

    def buffer_target(self) -> int:
        """Uploads that close the round: buffer_size, or all the live clients if fewer,
        not counting those refused in this round (:mod:`mqttfl.engine.selection`)."""
        live = self.live()
        return max(1, min(self.fed.buffer_size, len(live) - len(self.refused.among(live))))

    # --- the loop ----------------------------------------------------------------------
    def _advance(self, now: float, actions: list[Action]) -> bool:
        if self.phase is not Phase.OPEN:
            return super()._advance(now, actions)
        if self.broker_down:
            return False
        if len(self.buffer.entries) < self.buffer_target() and now < self.deadline:
            return False
        if self.buffer.entries:
            actions.append(self._close(now))
            return True
        self._retry(now, "no upload in the buffer by the deadline")
        return True

    def _weighted(self, t: int, entries: list[Entry]) -> tuple[list[Upload], dict[str, float]]:
        """What the method aggregates for round t, and each upload's s(τ)."""
        low = t - self.fed.max_staleness
        fresh: list[Entry] = []
        for entry in entries:
            if self.server.keeps_latest:
                self.latest[entry.upload.client_id] = entry  # the newest set of each client
            else:
                fresh.append(entry)
        self.latest = {c: e for c, e in self.latest.items() if e.round >= low}
        chosen = fresh + sorted(
            self.latest.values(), key=lambda e: client_order(e.upload.client_id)
        )
        # s(τ) of each entry (one per client: the gate keeps one, `latest` its newest set)
        weights = {e.upload.client_id: staleness_weight(t - e.round, self.fed) for e in chosen}
        deltas = [self._delta(t, e, staleness_weight(t - e.round, self.fed)) for e in chosen]
        return deltas, weights

    def _delta(self, t: int, entry: Entry, s: float) -> Upload:
        """The upload as it counts in version t (the method's :meth:`rebase`)."""
        base, now = self.versions.get(entry.round - 1, {}), self.versions.get(t - 1, {})
        return self.server.rebase(entry.upload, s, base, now)

    def _close(self, now: float) -> Close:
        t, state = self.round, self.state
        entries = self.buffer.close_buffer()
        for entry in entries:
            self.staleness[t - entry.round] += 1
            state.uploads[entry.upload.client_id] += 1  # [privacy]'s accountant counts them
            self.part(entry.upload.client_id).uploaded += 1
            state.comm["up_bytes"] += entry.bytes
            state.comm["up_count"] += 1
        uploads, weights = self._weighted(t, entries)
        downlinks = aggregate_checked(
            self.server, t, uploads, state.rejections, self.log, staleness=weights
        )
        kept = self.server.version(downlinks)
        if kept:
            self.versions[t] = kept
        self.versions = {
            v: g for v, g in self.versions.items() if v >= t - self.fed.max_staleness - 1
        }
        payloads = encode_downlinks(self.config.run_id, t, downlinks.broadcast, downlinks.personal)
        self.down_bytes.closed(t, payloads, self.live(), chosen=())
        state.round, state.downlinks = t, payloads
        state.server = self.server.state_dict()
        state.clients = sorted(self.clients, key=client_order)
        log = {
            "version": t,
            "uploads": len(entries),
            "aggregated": len(uploads),
            "staleness": {e.upload.client_id: t - e.round for e in entries},
            **self._progress(t - 1),
        }
        self.round, self.attempt = t + 1, 1
        if self.round > self.config.rounds:
            self.phase, self.phase_until = Phase.FINAL, now + self.fed.final_metrics_timeout_s
            self.buffer.ended = True
        else:
            self._wait_for_live(now)
        self.dirty = False
        return Close(t, payloads, self.checkpoint(), log)

    def summary(self) -> RunSummary:
        block = BufferedBlock(
            versions=self.state.round,
            buffer_size=self.fed.buffer_size,
            max_staleness=self.fed.max_staleness,
            staleness_weighting=self.fed.staleness_weighting,
            staleness={str(k): n for k, n in sorted(self.staleness.items())},
            too_stale=self.state.rejections.get("too_stale", 0),
            client_staleness=dict(sorted(self.client_staleness.items())),  # newest upload's τ
        )
        return super().summary().model_copy(update={"buffered": block})


def engine_for(config: RunConfig) -> type[RoundEngine]:
    """The engine of ``federation.mode``: synchronous rounds, or buffered."""
    return BufferedEngine if config.federation.mode == "buffered" else RoundEngine
