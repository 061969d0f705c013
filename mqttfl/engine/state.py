"""The coordinator's run state: counters, traffic accounting and the checkpoint, in one
place; and :func:`check_resume`, where a restarted coordinator goes on from."""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttfl.config import RunConfig
from mqttfl.engine.documents import (
    Checkpoint,
    ClientPart,
    MetricsLine,
    PrivacyBlock,
    RunSummary,
    SavedDownlinks,
    Traffic,
    checkpoint_from_map,
)
from mqttfl.engine.journal import Journal, mean_over_clients, read_checkpoint, summarize_clients
from mqttfl.engine.parts import Part
from mqttfl.errors import DataError, StateError
from mqttfl.files import JsonLines, one_line, set_aside, set_aside_tail
from mqttfl.privacy.accountant import privacy_summary
from mqttfl.wire.downlinks import DownlinkPayloads
from mqttfl.wire.ids import client_order

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger as BoundLogger

__all__ = [
    "MetricsLine",
    "Resume",
    "RunState",
    "RunSummary",
    "check_resume",
    "client_order",
    "run_summary",
]


def new_instance() -> str:
    """A run instance id: a run started afresh under a run id used before is not that run."""
    return secrets.token_hex(8)


def _comm() -> dict[str, int]:
    return {"up_bytes": 0, "up_count": 0, "down_bytes": 0, "down_count": 0}


@dataclass
class RunState:
    """Everything a restarted coordinator needs to go on after round ``round``."""

    round: int = 0  # the last closed round
    server: dict[str, object] = field(default_factory=dict)  # the method's server state
    comm: dict[str, int] = field(default_factory=_comm)  # payload bytes and counts
    retries: int = 0
    missing_uploads: int = 0
    rejections: Counter[str] = field(default_factory=Counter)  # uploads, by reason
    rejected_messages: Counter[str] = field(default_factory=Counter)  # everything else
    # The last round's downlinks, encoded once: re-sent as they are after a crash.
    downlinks: DownlinkPayloads | None = None
    clients: list[str] = field(default_factory=list)  # registered at the last close
    uploads: Counter[str] = field(default_factory=Counter)  # accepted, per client
    last_uploaders: list[str] = field(default_factory=list)  # whose uploads round `round` took
    # federation.mode = "buffered": the buffer, latest sets and versions (engine/buffered.py)
    buffered: dict[str, object] = field(default_factory=dict)
    # This run of the run id: made when it starts afresh, kept across resumes, published
    # with every start and run state (a device's state of another instance starts fresh).
    instance: str = field(default_factory=new_instance)
    parts: dict[str, Part] = field(default_factory=dict)  # each client's part (roster.py)

    def to_dict(self, config: RunConfig) -> dict[str, object]:
        """checkpoint.msgpack's map (:class:`~mqttfl.engine.documents.Checkpoint`)."""
        downlinks = self.downlinks
        return Checkpoint.model_construct(
            run_id=config.run_id,
            method=config.method,
            round=self.round,
            server=self.server,
            comm=dict(self.comm),
            retries=self.retries,
            missing_uploads=self.missing_uploads,
            rejections=dict(self.rejections),
            rejected_messages=dict(self.rejected_messages),
            downlink_payloads=None
            if downlinks is None
            else SavedDownlinks.model_construct(
                broadcast=downlinks.broadcast, personal=downlinks.personal
            ),
            clients=sorted(self.clients, key=client_order),
            uploads=dict(self.uploads),
            last_uploaders=sorted(self.last_uploaders, key=client_order),
            buffered=self.buffered,
            instance=self.instance,
            parts={c: ClientPart.model_construct(**p.to_map()) for c, p in self.parts.items()},
        ).to_map()

    @classmethod
    def from_dict(cls, data: Any, config: RunConfig, *, source: str) -> RunState:
        """StateError if the checkpoint belongs to another run or method, and DataError
        naming ``source`` and the field if it is malformed or of another version."""
        saved = checkpoint_from_map(data, source, run_id=config.run_id, method=config.method)
        return cls.from_checkpoint(saved)

    @classmethod
    def from_checkpoint(cls, saved: Checkpoint) -> RunState:
        downlinks = saved.downlink_payloads
        return cls(
            round=saved.round,
            server=saved.server,
            comm={**_comm(), **saved.comm},
            retries=saved.retries,
            missing_uploads=saved.missing_uploads,
            rejections=Counter(saved.rejections),
            rejected_messages=Counter(saved.rejected_messages),
            downlinks=None
            if downlinks is None
            else DownlinkPayloads(downlinks.broadcast, dict(downlinks.personal)),
            clients=list(saved.clients),
            uploads=Counter(saved.uploads),
            last_uploaders=list(saved.last_uploaders),
            buffered=dict(saved.buffered),
            instance=saved.instance or new_instance(),
            parts={c: Part(**p.model_dump()) for c, p in saved.parts.items()},
        )


@dataclass(frozen=True)
class Resume:
    """Where a (re)started coordinator goes on from, as read from its run dir: nothing
    changed there yet. :meth:`apply` sets aside what the crash left (a checkpoint that
    does not decode, a partial last line of metrics.jsonl) once the run is ours."""

    state: RunState | None
    records: list[MetricsLine]
    metrics: JsonLines
    unusable: tuple[Path, str] | None = None  # a checkpoint passed over, and why

    def apply(self, log: BoundLogger) -> None:
        if self.unusable is not None:
            path, reason = self.unusable
            kept = set_aside(path, "bad") if path.exists() else None
            log.warning(
                "checkpoint.fell_back",
                path=str(path),
                kept_as=None if kept is None else kept.name,
                reason=reason,
                from_round=None if self.state is None else self.state.round,
            )
        set_aside_tail(self.metrics)


def check_resume(journal: Journal, config: RunConfig) -> Resume:
    """Read the run dir a coordinator resumes from, changing nothing: the newest
    checkpoint that decodes (else the previous one, kept for this), and metrics.jsonl up
    to its last complete line. MqttflError (one line naming the file and what is wrong)
    if the run dir holds another run, or checkpoints of which none decodes, or a
    malformed metrics.jsonl."""
    problems: list[str] = []
    state: RunState | None = None
    unusable: tuple[Path, str] | None = None
    for path in (journal.checkpoint_path, journal.previous_checkpoint_path):
        if not path.exists():
            if path == journal.checkpoint_path and journal.previous_checkpoint_path.exists():
                # gone (removed by hand): the previous one is all there is
                unusable, problems = (path, "missing"), [f"{path}: missing"]
            continue
        try:
            state = RunState.from_dict(read_checkpoint(path), config, source=str(path))
            _server_loads(state, config, source=path)
        except DataError as exc:
            problems.append(str(exc))
            unusable = unusable or (path, str(exc))
            continue
        break
    if state is None and problems:
        raise StateError(f"cannot resume: {'; '.join(problems)}")
    records, metrics = journal.read_metrics()
    return Resume(state, records if state is not None else [], metrics, unusable)


def _server_loads(state: RunState, config: RunConfig, *, source: Path) -> None:
    """DataError if the method's server cannot take the checkpoint's server state."""
    from mqttfl.algorithms import get_algorithm, make_context

    server = get_algorithm(config.method).server(make_context(config))
    try:
        server.load_state_dict(state.server)
    except Exception as exc:
        raise DataError(
            source, f"its {config.method} server state does not load: {one_line(exc)}"
        ) from None


def round_progress(records: list[MetricsLine], clients: int, t: int) -> dict[str, object]:
    """The mean accuracy and MAE of round t's metrics so far (for ``round.closed``)."""
    rows = [r for r in records[-4 * max(clients, 1) :] if r.round == t]
    if not rows:
        return {}
    return {
        "evaluated_round": t,
        "mean_accuracy": round(float(np.mean([r.accuracy for r in rows])), 4),
        "mean_mae": round(float(np.mean([r.mae for r in rows])), 3),
    }


def run_summary(
    config: RunConfig, state: RunState, records: list[MetricsLine], *, ended: str | None = None
) -> RunSummary:
    """summary.json: per-client metrics (last five rounds), traffic and every counter;
    ``ended`` says why the run stopped before its last round."""
    from mqttfl.data.sources import labels_are_ordinal

    table = {
        client: row
        if client not in state.parts
        else row.model_copy(update=state.parts[client].to_map())
        for client, row in summarize_clients(records).items()
    }
    comm = state.comm
    up_n, down_n = max(comm["up_count"], 1), max(comm["down_count"], 1)
    privacy = privacy_summary(config, state.uploads).get("privacy")
    return RunSummary(
        run_id=config.run_id,
        method=config.method,
        # which test windows produced these numbers (mqttfl/data/sessions.py)
        split=config.data.split,
        # whether labels are counts: an MAE is shown only then (None: shards not readable here)
        ordinal_labels=labels_are_ordinal(config.data),
        rounds_completed=state.round,
        clients=table,
        mean=mean_over_clients(table),
        comm=Traffic(
            up_bytes_per_client_round=comm["up_bytes"] / up_n,
            down_bytes_per_client_round=comm["down_bytes"] / down_n,
            up_bytes_total=comm["up_bytes"],
            down_bytes_total=comm["down_bytes"],
        ),
        rejections=dict(state.rejections),
        rejected_messages=dict(state.rejected_messages),
        retries=state.retries,
        missing_uploads=state.missing_uploads,
        config=config.recorded(),
        **({} if privacy is None else {"privacy": PrivacyBlock.model_validate(privacy)}),
        **({} if ended is None else {"ended_early": ended}),
    )
