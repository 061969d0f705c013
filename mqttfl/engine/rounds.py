"""The round engine: the one round loop of mqttfl, with no MQTT and an injected clock.

Each round: select a seeded fraction of the live, responsive clients; open the round
(the :class:`Announce` action); gather uploads until every selected client has uploaded,
left (its last will), or never acknowledged the start within ``ack_timeout_s``, or had
its upload refused or said it cannot train (:mod:`mqttfl.engine.selection`), or the
deadline passes; aggregate if at least ``min_clients`` uploads arrived, else re-announce
(up to ``max_round_attempts``); check the aggregate (an upload that makes it non-finite
is dropped, not the round); hand the encoded downlinks and the checkpoint to the caller
(:class:`Close`). After the last round it waits for the final metrics (:class:`Finish`).

Sans-IO: the bus adapter (:mod:`mqttfl.nodes.coordinator`) feeds it decoded events
(``on_*``), performs the actions :meth:`RoundEngine.step` returns and steps again at
:meth:`RoundEngine.wake_at`; tests drive it in-process with a fake clock. A selected
client that never acknowledged (a forged ``online``, a hung device) is left out of
selections until it shows life again: it costs one ``ack_timeout_s``, never a deadline.
"""

from __future__ import annotations

import logging
import math
import secrets

from mqttfl.algorithms.base import Algorithm, Context, ServerSide, Upload
from mqttfl.config import RunConfig
from mqttfl.engine.actions import (
    WAITING_FOR_CLIENTS,
    Action,
    Announce,
    ClientRecord,
    Clock,
    Close,
    Finish,
    Phase,
    Rebroadcast,
)
from mqttfl.engine.aggregate import aggregate_checked
from mqttfl.engine.downbytes import DownBytes
from mqttfl.engine.gate import UploadGate
from mqttfl.engine.held import HeldUpload, HeldUploads
from mqttfl.engine.roster import Roster
from mqttfl.engine.selection import Refusals, select_clients
from mqttfl.engine.sites import SiteNotices
from mqttfl.engine.state import MetricsLine, RunState, RunSummary, round_progress, run_summary
from mqttfl.errors import RejectedUpload, RunAborted, WireError
from mqttfl.logs import get_logger
from mqttfl.privacy.accountant import BUDGET_EXHAUSTED
from mqttfl.wire.control import Ack, Metrics, Offline, Online, RoundStart, RunStatus, Status
from mqttfl.wire.downlinks import encode_downlinks
from mqttfl.wire.ids import client_order

RESUME_LISTEN_S = 5.0  # on resume, how long to wait for the statuses of known clients
WILL_SETTLE_S = 0.5  # after last wills, how long to watch whether our own connection drops too
RETRY_GRACE_S = 3.0  # before a retry, how long to wait for the clients asked before to be back
# after a broker restart, how long the clients may take to reconnect (their backoff) and announce
RECONNECT_GRACE_S = 8.0


class RoundEngine(Roster):
    def __init__(
        self,
        config: RunConfig,
        algorithm: Algorithm,
        ctx: Context,
        *,
        clock: Clock,
        state: RunState | None = None,
        records: list[MetricsLine] | None = None,
    ) -> None:
        self.config = config
        self.fed = config.federation
        self.clock = clock
        self.server: ServerSide = algorithm.server(ctx)
        self.state = state or RunState()
        self.gate = self._gate_type()(
            algorithm,
            ctx,
            config.run_id,
            self.fed.max_upload_bytes,
            self.state.rejections,
            self.state.uploads,
        )
        self.clients: dict[str, ClientRecord] = {}
        self.sites = SiteNotices()
        self.records: list[MetricsLine] = list(records or [])
        self.metrics_seen: dict[int, set[str]] = {}
        for record in self.records:
            self.metrics_seen.setdefault(record.round, set()).add(record.client_id)
        self.log = get_logger(run_id=config.run_id, client_id="coordinator")
        self.round = self.state.round + 1
        self.attempt = 1
        self.selected: list[str] = []
        self.acked: set[str] = set()
        self.refused = Refusals()  # selected clients of this round that will not upload
        self.announcement = 0
        self.deadline = self.ack_deadline = self.phase_until = 0.0
        self.opened_at = -math.inf  # when the newest round opened (federation.pace_s)
        self.last_offline = -math.inf
        self.grace_until = -math.inf
        self.broker_down = False
        self.rebroadcast_due = False  # the broker came back: its retained broadcast may be gone
        self._waiting_logged = False
        self.privacy = ctx.privacy
        self.held = HeldUploads()  # uploads that came before their sender's status
        self.ended = ""  # why the run ended before its last round ("": it did not)
        on_demand = algorithm.fetched_on_demand(config)
        self.down_bytes = DownBytes(config, self.state, on_demand=on_demand)
        now = clock()
        if self.state.round > 0:
            self.server.load_state_dict(self.state.server)
            self.gate.round = self.state.round
            self.phase, self.phase_until = Phase.RESUMING, now + RESUME_LISTEN_S
            self.log.info("run.resumed", from_round=self.round)
        else:
            self.phase, self.phase_until = Phase.JOINING, now + self.fed.join_timeout_s
        if self.round > config.rounds:
            self.phase, self.phase_until = Phase.FINAL, now + self.fed.final_metrics_timeout_s
        self._start_mode()

    def _gate_type(self) -> type[UploadGate]:
        """The upload gate of this mode (buffered mode's holds a buffer)."""
        return UploadGate

    def _start_mode(self) -> None:
        """What a mode sets up once the engine is (a hook: buffered mode restores its
        buffer from the checkpoint)."""

    # --- events ------------------------------------------------------------------------
    def on_status(self, status: Status) -> None:
        """An announcement the method cannot serve raises WireError (and changes nothing)."""
        if isinstance(status, Online):
            self.gate.schema_for(status.info)
            self.clients[status.info.client_id] = ClientRecord(status.info)
            self.came_back(status.info.client_id)
            self.log.info(
                "client.online",
                client=status.info.client_id,
                arch=status.info.arch,
                samples=status.info.num_samples,
                **({"waiting_for": self.missing()} if self.phase in WAITING_FOR_CLIENTS else {}),
            )
            for held in self.held.take(status.info.client_id):
                self._decide_held(status.info.client_id, held)
            return
        assert isinstance(status, Offline)
        record = self.clients.get(status.client_id)
        if record is not None and status.reason == BUDGET_EXHAUSTED:
            record.budget_spent = True
        if record is not None and record.online:
            record.online = False
            self.went(status.client_id)
            self.last_offline = self.clock()
            self.log.warning(
                "client.offline", client=status.client_id, reason=status.reason, round=self.round
            )

    def _alive(self, client: str) -> None:
        """Anything a registered client sends proves it is there."""
        record = self.clients.get(client)
        if record is not None:
            if not record.online:
                self.came_back(client)
            record.online = record.responsive = True

    def on_ack(self, ack: Ack) -> None:
        if ack.client_id not in self.clients:
            raise WireError("unknown_client", f"client {ack.client_id!r} never announced itself")
        self._alive(ack.client_id)
        if self.phase is Phase.OPEN and ack.round == self.round:
            self.acked.add(ack.client_id)
            if ack.cannot_train:
                self._refused(ack.round, ack.client_id, f"cannot_train: {ack.cannot_train}")

    def on_upload(self, t: int, client: str, raw: bytes, wire_bytes: int = -1) -> Upload | None:
        """Accept an upload or raise RejectedUpload (counted in the run state; the first
        refusal of a selected client's upload for the open round ends the wait for it);
        None: held until its sender, known from the checkpoint, announces itself (held.py)."""
        record = self.clients.get(client)
        if record is None and client in self.state.clients:
            self.gate.screen(t, client, len(raw))
            if self.held.hold(t, client, raw, wire_bytes):
                return None
        try:
            upload = self.gate.check(t, client, raw, record.info if record else None, wire_bytes)
        except RejectedUpload as exc:
            self._refused(t, client, exc.reason)
            raise
        self._alive(client)
        self.acked.add(client)
        self.server.prepare(t, upload)
        return upload

    def _decide_held(self, client: str, held: HeldUpload) -> None:
        try:
            self.on_upload(held.round, client, held.raw, held.wire_bytes)
        except RejectedUpload as exc:
            self.log.warning("upload.rejected", round=held.round, client=client, reason=exc.reason)
            return
        self.log.info("upload.released", round=held.round, client=client)

    def on_metrics(self, metrics: Metrics) -> MetricsLine | None:
        """The record to journal, or None for a repeat; WireError for one that cannot be
        true (an unknown client, a round that has not closed)."""
        t, client = metrics.round, metrics.client_id
        if client not in self.clients:
            raise WireError(
                "unknown_client", f"metrics from {client!r}, which never announced itself"
            )
        if t > self.state.round:
            raise WireError("future", f"metrics for round {t}, which has not closed")
        self._alive(client)
        if self.metrics_repeat(t, client):
            return None
        self.metrics_seen.setdefault(t, set()).add(client)
        if self.phase is Phase.FINAL and t == self.state.round:
            # counted from the newest last score: the wait goes on while scores keep coming
            self.phase_until = max(
                self.phase_until, self.clock() + self.fed.final_metrics_timeout_s
            )
        record = MetricsLine.of(metrics)
        self.records.append(record)
        return record

    def _refused(self, t: int, client: str, reason: str) -> None:
        """Count a selected client's refusal once for the open round t (selection.py)."""
        if self.phase is Phase.OPEN and self.refused.add(self.gate, t, client, reason):
            self.log.warning("round.client_refused", round=t, client=client, reason=reason)

    def metrics_repeat(self, t: int, client: str) -> bool:
        """O(1), before decoding: ``client``'s metrics of round ``t`` are in already."""
        return client in self.metrics_seen.get(t, ())

    def on_site(self, site: str, up: bool) -> None:
        """A site's bridge to this broker came or went (Mosquitto publishes its will): when
        it goes, every client behind it is gone at once; back, they announce themselves.
        Only a change counts, and at most one drop per site per SITE_HOLD_S (sites.py)."""
        change = self.sites.change(site, up, self.clock())
        if change is None:
            return
        behind = [c for c, r in self.clients.items() if r.info.site == site and r.online]
        event = "site.held" if change == "held" else f"site.{change}"
        self.log.warning(event, site=site, round=self.round, clients=sorted(behind))
        if change != "down":
            return
        for client in behind:
            self.on_status(Offline(client, f"site {site} down"))

    def on_broker_lost(self) -> None:
        self.broker_down = True

    def on_broker_back(self) -> None:
        """Every client lost its connection with ours: give them time to come back."""
        if not self.broker_down:
            return
        self.broker_down = False
        self.rebroadcast_due = True
        now = self.clock()
        self.grace_until = now + RECONNECT_GRACE_S
        if self.phase is Phase.OPEN:
            self.ack_deadline = max(self.ack_deadline, self.grace_until + self.fed.ack_timeout_s)
            self.log.warning("round.broker_returned", round=self.round, grace_s=RECONNECT_GRACE_S)

    # --- the loop ----------------------------------------------------------------------
    def step(self) -> list[Action]:
        """Advance as far as the clock and the events allow; return what to perform."""
        actions: list[Action] = []
        if self.rebroadcast_due and (held := self.state.downlinks) is not None:
            actions.append(Rebroadcast(self.state.round, held.broadcast))
        self.rebroadcast_due = False
        while self._advance(self.clock(), actions):
            pass
        return actions

    def wake_at(self) -> float | None:
        """When :meth:`step` must run again even if no event arrives."""
        if self.phase is Phase.DONE:
            return None
        now = self.clock()
        timers = [self.phase_until, self.opened_at + self.fed.pace_s]
        if self.phase is Phase.OPEN:
            timers += [
                self.deadline,
                self.ack_deadline,
                self.grace_until,
                self.last_offline + WILL_SETTLE_S,
            ]
        future = [t for t in timers if t > now]
        return min(future) if future else now + 1.0

    @property
    def finished(self) -> bool:
        return self.phase is Phase.DONE

    def _advance(self, now: float, actions: list[Action]) -> bool:
        phase = self.phase
        if phase is Phase.JOINING:
            joined = len(self.live()) >= self.fed.num_clients
            if not joined and now < self.phase_until:
                return False
            self.log.log(
                logging.INFO if joined else logging.WARNING,
                "clients.joined",
                live=len(self.live()),
                expected=self.fed.num_clients,
                all_joined=joined,
                missing=self.missing(),
            )
            self._wait_for_live(now)
            return True
        if phase is Phase.RESUMING:
            heard = set(self.state.clients) <= set(self.clients)
            if not heard and now < self.phase_until:
                return False
            self.log.info(
                "clients.rejoined",
                live=len(self.live()),
                known=len(self.state.clients),
                all_heard=heard,
            )
            if self.state.downlinks is not None:  # the crash may have come before they all went out
                actions.append(Close(self.state.round, self.state.downlinks, None))
            self._wait_for_live(now)
            return True
        if phase is Phase.RETRY_GRACE:
            asked = set(self.gate.selected) - set(self.gate.accepted)
            if not asked <= set(self.live()) and now < self.phase_until:
                return False
            self._wait_for_live(now)
            return True
        if phase is Phase.WAITING:
            if now < self.opened_at + self.fed.pace_s:
                return False  # (wake_at wakes us then)
            if len(self.selectable()) >= self.fed.min_clients:
                actions.append(self._open(now))
                return True
            if self.privacy is not None and self.budgets_left() < self.fed.min_clients:
                self._end_early(now, "privacy budgets spent")
                return True
            if not self._waiting_logged:
                self._waiting_logged = True
                self.log.warning(
                    "round.waiting",
                    round=self.round,
                    reason="too few live clients",
                    live=len(self.selectable()),
                    min_clients=self.fed.min_clients,
                    missing=self.missing(),
                    attempt=self.attempt,
                )
            if now < self.phase_until:
                return False
            self._retry(now, "too few live clients")
            return True
        if phase is Phase.OPEN:
            if not self._round_done(now):
                return False
            if len(self.gate.accepted) >= self.fed.min_clients:
                actions.append(self._close(now))
                return True
            self._retry(now, "fewer uploads than min_clients")
            return True
        if phase is Phase.FINAL:
            last = self.state.round
            expected = set(self.live())
            if self.fed.evaluate == "when_trained" and last < self.config.rounds:
                # ended early: only who uploaded in it score round `last` (kept across resumes)
                expected &= set(self.state.last_uploaders)
            unreported = sorted(expected - self.metrics_seen.get(last, set()), key=client_order)
            if unreported and now < self.phase_until:
                return False
            if unreported:  # the table then lacks their last round: say so, and what to raise
                self.log.warning(
                    "metrics.missing",
                    round=last,
                    clients=len(unreported),
                    missing=unreported[:20],
                    waited_s=self.fed.final_metrics_timeout_s,
                    hint="federation.final_metrics_timeout_s",
                )
            actions.append(Finish(self.summary()))
            self.phase = Phase.DONE
            self.log.info(
                "run.finished",
                rounds=last,
                rejections=dict(self.state.rejections),
                unreported=len(unreported),
                **({"ended": self.ended} if self.ended else {}),
            )
        return False

    def _end_early(self, now: float, reason: str) -> None:
        """No round can gather ``min_clients`` uploads again: the run ends after its last
        closed round, with its summary saying why."""
        self.ended = f"{reason} after round {self.state.round} of {self.config.rounds}"
        self.log.warning(
            "run.ending",
            round=self.round,
            reason=reason,
            budgets_left=self.budgets_left(),
            min_clients=self.fed.min_clients,
        )
        self.phase, self.phase_until = Phase.FINAL, now + self.fed.final_metrics_timeout_s

    def _wait_for_live(self, now: float) -> None:
        self.phase, self.phase_until = Phase.WAITING, now + self.fed.round_timeout_s
        self._waiting_logged = False

    def _open(self, now: float) -> Announce:
        t, attempt = self.round, self.attempt
        selected = select_clients(
            self.selectable(),
            fraction=self.fed.fraction,
            min_clients=self.fed.min_clients,
            seed=self.config.seed,
            t=t,
            attempt=attempt,
        )
        if attempt > 1:  # a retry asks again whoever was asked before and is live
            earlier = set(self.gate.selected) - set(self.gate.accepted)
            selected = sorted(set(selected) | (earlier & set(self.live())), key=client_order)
        self.gate.open_round(t, selected, keep=attempt > 1)
        self.down_bytes.chosen(t, selected)
        self.refused.open(t)
        self.selected = selected
        self.acked = set(self.gate.accepted)
        self.deadline = now + self.fed.round_timeout_s
        self.ack_deadline = now + self.fed.ack_timeout_s
        self.opened_at = now
        self.announcement = secrets.randbits(62)
        self.phase = Phase.OPEN
        start = RoundStart(
            round=t,
            selected=tuple(selected),
            timeout_s=self.fed.round_timeout_s,
            params=self.server.round_params(t),
            attempt=attempt,
            uploaded=tuple(sorted(self.gate.accepted, key=client_order)),
            announcement=self.announcement,
            instance=self.state.instance,
        )
        # logged by the node as it announces it, after the close before it
        return Announce(start, RunStatus("open", t, start, instance=self.state.instance))

    def _round_done(self, now: float) -> bool:
        if self.broker_down:
            return False  # nothing can arrive or leave; the bus reconnects
        if now >= self.deadline:
            return True
        pending = [
            c for c in self.selected if c not in self.gate.accepted and c not in self.refused
        ]
        gone = [c for c in pending if not self.clients[c].online]
        alive = [c for c in pending if self.clients[c].online]
        if now < self.grace_until and gone:
            return False  # after a broker restart, they may still come back
        if any(c in self.acked or now < self.ack_deadline for c in alive):
            return False
        for client in alive:  # selected, never acknowledged: a ghost or a hung device
            self.clients[client].responsive = False
            self.log.warning("client.unresponsive", client=client, round=self.round)
        # A broker going down fires every client's will just before our own link drops.
        return not gone or now >= self.last_offline + WILL_SETTLE_S

    def _retry(self, now: float, reason: str) -> None:
        self.state.retries += 1
        self.log.warning(
            "round.retried",
            round=self.round,
            reason=reason,
            uploads=len(self.gate.accepted),
            min_clients=self.fed.min_clients,
            attempt=self.attempt,
        )
        self.attempt += 1
        if self.attempt > self.fed.max_round_attempts:
            raise RunAborted(
                f"round {self.round}: fewer than min_clients={self.fed.min_clients} uploads after "
                f"{self.fed.max_round_attempts} attempts"
            )
        self.phase, self.phase_until = Phase.RETRY_GRACE, now + RETRY_GRACE_S

    def _close(self, now: float) -> Close:
        t, state = self.round, self.state
        uploads = self.gate.close_round()
        missing = sorted(set(self.gate.selected) - set(self.gate.accepted), key=client_order)
        for client in missing:
            state.missing_uploads += 1
            self.log.warning(
                "upload.missing", round=t, client=client, online=self.clients[client].online
            )
        downlinks = aggregate_checked(self.server, t, uploads, self.state.rejections, self.log)
        state.last_uploaders = sorted(self.gate.accepted, key=client_order)
        state.uploads.update(self.gate.accepted_bytes.keys())  # the accountant's count
        self.count_round(self.gate.selected, set(self.gate.accepted))
        for size in self.gate.accepted_bytes.values():
            state.comm["up_bytes"] += size
            state.comm["up_count"] += 1
        payloads = encode_downlinks(self.config.run_id, t, downlinks.broadcast, downlinks.personal)
        self.down_bytes.closed(t, payloads, self.live(), self.gate.selected)
        state.round, state.downlinks = t, payloads
        state.server = self.server.state_dict()
        state.clients = sorted(self.clients, key=client_order)
        log = {"uploads": len(uploads), "missing": missing, **self._progress(t - 1)}
        self.round, self.attempt = t + 1, 1
        if self.round > self.config.rounds:
            self.phase, self.phase_until = Phase.FINAL, now + self.fed.final_metrics_timeout_s
        else:
            self._wait_for_live(now)
        return Close(t, payloads, state.to_dict(self.config), log)

    def _progress(self, t: int) -> dict[str, object]:
        return round_progress(self.records, len(self.clients), t)

    def summary(self) -> RunSummary:
        return run_summary(self.config, self.state, self.records, ended=self.ended or None)
