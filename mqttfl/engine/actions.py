"""What the round engine hands its caller (:class:`Action`), the phases of a round, and
what it knows of each client: the vocabulary shared by :mod:`mqttfl.engine.rounds`, the
buffered engine and the coordinator that performs the actions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from mqttfl.engine.state import RunSummary
from mqttfl.wire.control import RoundStart, RunStatus
from mqttfl.wire.downlinks import DownlinkPayloads
from mqttfl.wire.schemas import ClientInfo

Clock = Callable[[], float]


@dataclass
class ClientRecord:
    info: ClientInfo
    online: bool = True
    responsive: bool = True  # False after a selection it never acknowledged
    budget_spent: bool = False  # it said so ([privacy]); it never uploads again


@dataclass(frozen=True)
class Announce:
    """Publish the retained run status, then the round's start."""

    start: RoundStart
    status: RunStatus

    def fields(self) -> dict[str, object]:
        """``round.started``'s fields."""
        start = self.start
        return {
            "round": start.round,
            "selected": list(start.selected),
            "attempt": start.attempt,
            "deadline_s": start.timeout_s,
        }


@dataclass(frozen=True)
class Close:
    """Round ``round`` is aggregated: checkpoint, publish the downlinks, mark it closed.
    With ``checkpoint`` None it is a re-publication after a restart (already saved)."""

    round: int
    payloads: DownlinkPayloads
    checkpoint: dict[str, object] | None
    log: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    summary: RunSummary


@dataclass(frozen=True)
class Keep:
    """Write the checkpoint, publish nothing (buffered mode: an upload entered the buffer)."""

    checkpoint: dict[str, object]


@dataclass(frozen=True)
class Rebroadcast:
    """Publish round ``round``'s broadcast again, retained: the broker came back and may
    have lost its copy, which clients fetch when they join or are chosen."""

    round: int
    broadcast: bytes


Action = Announce | Close | Finish | Keep | Rebroadcast


class Phase(Enum):
    JOINING = "joining"
    RESUMING = "resuming"
    WAITING = "waiting"  # for min_clients live clients
    RETRY_GRACE = "retry_grace"
    OPEN = "open"
    FINAL = "final"  # waiting for the last round's metrics
    DONE = "done"


WAITING_FOR_CLIENTS = (Phase.JOINING, Phase.WAITING)  # client.online lines name who is missing
