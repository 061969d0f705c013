"""A request to send an upload again: the coordinator could not put it together.

A large upload travels in chunks (:mod:`mqttfl.wire.chunks`); one that cannot be
completed (refused for room, given up on, corrupted) is reported to its sender, which
sends it again within the round. The request travels on the client's personal downlink
topic, the one per-client topic a client already reads (and the broker's ACL lets it).
"""

from __future__ import annotations

from dataclasses import dataclass

from mqttfl.errors import WireError
from mqttfl.wire.codec import Message, decode, encode
from mqttfl.wire.control import (
    CONTROL_LIMIT,
    COORDINATOR,
    body_keys,
    check_envelope,
    round_number,
    text_field,
)
from mqttfl.wire.downlinks import Downlink, downlink_from
from mqttfl.wire.ids import check_id

RESEND_REASONS = frozenset({"chunk_incomplete", "chunk_busy", "chunk_checksum"})


@dataclass(frozen=True)
class Resend:
    """The coordinator could not put together ``client_id``'s upload of round ``round``:
    send it again while the round is open."""

    round: int
    client_id: str
    reason: str
    message: int  # the chunked message's id: only a client's newest send is sent again

    def __post_init__(self) -> None:
        round_number(self.round, low=1)
        check_id(self.client_id)
        if self.reason not in RESEND_REASONS:
            raise WireError("range", f"unknown resend reason {str(self.reason)[:40]!r}")
        if not isinstance(self.message, int) or not 0 <= self.message < 2**64:
            raise WireError("range", "a resend request's message id is a 64-bit integer")

    def encode(self, run: str) -> bytes:
        body = {"client": self.client_id, "reason": self.reason, "message": self.message}
        return encode(Message("resend", run, self.round, COORDINATOR, body))


def read_downlink_or_resend(
    raw: bytes, *, run_id: str, round: int, client: str
) -> Downlink | Resend:
    """What a client's own downlink topic carries: its personal downlink, or a request
    to send its upload again."""
    message = decode(raw)
    if message.type != "resend":
        return downlink_from(
            check_envelope(message, "downlink", run_id, COORDINATOR, round), client
        )
    if len(raw) > CONTROL_LIMIT:
        raise WireError("oversize", f"a resend request of {len(raw)} bytes")
    message = check_envelope(message, "resend", run_id, COORDINATOR, round)
    body = message.body
    body_keys(body, {"client", "reason", "message"})
    if body["client"] != client:
        raise WireError("sender", f"a resend request for another client on {client!r}'s topic")
    if isinstance(body["message"], bool):
        raise WireError("type", "a resend request's message id is an integer")
    return Resend(message.round, client, text_field("reason", body["reason"], 40), body["message"])
