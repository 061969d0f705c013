"""What a client takes from the broker: every message validated before it is acted on.

Decoded and checked by :mod:`mqttfl.wire.control` (and :mod:`mqttfl.wire.resend`), then
by the method's own downlink check; anything hostile is a WireError with its reason.
Also what the client holds meanwhile: a round's downlinks until both parts are in.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from mqttfl.algorithms.base import ClientSide
from mqttfl.bus.transport import Incoming
from mqttfl.config import RunConfig
from mqttfl.errors import WireError
from mqttfl.wire import Topics
from mqttfl.wire.control import (
    Offline,
    RoundStart,
    RunStatus,
    read_run_status,
    read_start,
    read_status,
)
from mqttfl.wire.downlinks import Downlink
from mqttfl.wire.lease import Lease, read_lease
from mqttfl.wire.resend import Resend, read_downlink_or_resend
from mqttfl.wire.topics import DownTopic, LeaseTopic, StartTopic, StateTopic, StatusTopic


@dataclass(frozen=True)
class Received:
    """A validated message and when it arrived (monotonic)."""

    message: RoundStart | RunStatus | Downlink | Resend
    broadcast: bool  # came on the broadcast downlink topic (``down/all``)
    size: int
    received: float


def read_for_client(
    incoming: Incoming, *, config: RunConfig, client_id: str, method: ClientSide
) -> Received | Offline | Lease | None:
    """The validated message; an ``offline`` said about this client (to be answered);
    the run's lease (whether its coordinator is live); None for what needs no action.
    WireError for anything hostile."""
    if incoming.error is not None:  # chunks that could not be put together
        raise incoming.error
    run, size = config.run_id, len(incoming.payload)
    message: RoundStart | RunStatus | Downlink | Resend
    broadcast = False
    match Topics(config.run_id).parse(incoming.topic):
        case StatusTopic(client):
            if client == client_id and incoming.payload:
                status = read_status(incoming.payload, run_id=run, client=client_id)
                if isinstance(status, Offline):
                    return status
            return None
        case LeaseTopic():
            return read_lease(incoming.payload)
        case StartTopic(t):
            message = read_start(incoming.payload, run_id=run, round=t)
        case StateTopic():
            message = read_run_status(incoming.payload, run_id=run)
        case DownTopic(t, client) as down:
            if not down.broadcast and client != client_id:
                raise WireError("topic", f"a downlink for {client!r} reached {client_id!r}")
            broadcast = down.broadcast
            decoded = BROADCASTS.get(incoming) if broadcast else None
            message = decoded or read_downlink_or_resend(
                incoming.payload, run_id=run, round=t, client=client
            )
            if broadcast and decoded is None and isinstance(message, Downlink):
                BROADCASTS.keep(incoming, message)
        case other:
            raise WireError("topic", f"a client does not take {other.kind} messages")
    if message.round > config.rounds:
        raise WireError("range", f"round {message.round} is beyond the run's {config.rounds}")
    if (
        isinstance(message, RunStatus)
        and message.phase == "finished"
        and message.round < config.rounds
        and not message.ended  # (privacy budgets spent: no round can gather its uploads)
    ):
        raise WireError("range", f"'finished' after round {message.round} of {config.rounds}")
    if isinstance(message, Downlink):
        check_downlink(method, message, personal=not broadcast)
    return Received(message, broadcast, size, incoming.received)


class DecodedBroadcast:
    """The newest broadcast decoded in this process, for as long as a runner holds it: a
    fleet's runners receive one payload object (:mod:`mqttfl.bus.shared`), decoded once."""

    def __init__(self) -> None:
        self.topic, self.raw = "", b""
        self.decoded: weakref.ref[Downlink] | None = None

    def get(self, incoming: Incoming) -> Downlink | None:
        if self.decoded is None or incoming.topic != self.topic or incoming.payload is not self.raw:
            return None
        return self.decoded()

    def keep(self, incoming: Incoming, downlink: Downlink) -> None:
        self.topic, self.raw = incoming.topic, incoming.payload
        self.decoded = weakref.ref(downlink)


BROADCASTS = DecodedBroadcast()


def check_downlink(method: ClientSide, downlink: Downlink, *, personal: bool) -> None:
    """The method's own check of a downlink's shapes; any failure is the input's fault."""
    try:
        if personal:
            method.check_downlink({}, dict(downlink.body))
        else:
            method.check_downlink(dict(downlink.body), None)
    except WireError:
        raise
    except Exception as exc:  # the method's check failed on the input: the input is bad
        raise WireError("downlink", f"{type(exc).__name__}: {exc}"[:300]) from None


@dataclass
class PendingDownlink:
    broadcast: Downlink | None = None
    personal: Downlink | None = None
    size: int = 0
