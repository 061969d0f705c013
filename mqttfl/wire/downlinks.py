"""Downlinks: what the coordinator sends down after a round, checked as a tree of bounded
arrays here; what each method needs of it (shapes) is checked by the method's client."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mqttfl.errors import WireError
from mqttfl.wire.codec import Message, encode
from mqttfl.wire.control import (
    COORDINATOR,
    MAX_KEY_CHARS,
    client_ids,
    finite_number,
    read_envelope,
    round_number,
)
from mqttfl.wire.ids import BROADCAST

# Downlinks: every array value of every method stays far inside this (weights and
# prototypes are O(1-10)); a larger one is forged or diverged, and never reaches a model.
DOWNLINK_VALUE_BOUND = 1e6
MAX_DOWNLINK_DEPTH = 3
PERSONAL_LIST = "_personal"  # in the broadcast: who also gets a personalized downlink


def check_tree(name: str, value: Any, depth: int = 0) -> None:
    """A downlink body: maps of short names down to finite, bounded numeric arrays or
    numbers. What each method needs of it (shapes) is checked by the method's client."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiub":
            raise WireError("dtype", f"'{name}' has dtype {value.dtype}")
        if value.dtype.kind == "f" and value.size:
            peak = float(np.abs(value).max())  # one pass: NaN and Inf carry through max
            if not math.isfinite(peak):
                raise WireError("non_finite", f"'{name}' holds NaN or Inf")
            if peak > DOWNLINK_VALUE_BOUND:
                raise WireError("range", f"'{name}' has values beyond ±{DOWNLINK_VALUE_BOUND:g}")
        return
    if isinstance(value, Mapping):
        if depth >= MAX_DOWNLINK_DEPTH:
            raise WireError("malformed", f"'{name}' nests deeper than {MAX_DOWNLINK_DEPTH}")
        for key, item in value.items():
            if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
                raise WireError("type", f"'{name}' has a key that is not a short string")
            check_tree(f"{name}.{key}", item, depth + 1)
        return
    if isinstance(value, bool):
        return
    finite_number(name, value, low=-DOWNLINK_VALUE_BOUND, high=DOWNLINK_VALUE_BOUND)


@dataclass(frozen=True)
class Downlink:
    """Round ``round``'s broadcast (``personal_for`` set) or one client's personal body."""

    round: int
    body: Mapping[str, Any]
    personal_for: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        round_number(self.round, low=1)
        if not isinstance(self.body, Mapping):
            raise WireError("type", "a downlink body must be a map")
        check_tree("downlink", self.body)
        if self.personal_for is not None:
            client_ids(PERSONAL_LIST, self.personal_for)

    def encode(self, run: str) -> bytes:
        body = dict(self.body)
        if self.personal_for is not None:
            body[PERSONAL_LIST] = list(self.personal_for)
        return encode(Message("downlink", run, self.round, COORDINATOR, body))


def read_downlink(raw: bytes, *, run_id: str, round: int, client: str) -> Downlink:
    """``client`` is the topic's last level: a client id, or ``all`` for the broadcast."""
    message = read_envelope(
        raw, "downlink", run_id, sender=COORDINATOR, round=round, max_bytes=None
    )
    return downlink_from(message, client)


def downlink_from(message: Message, client: str) -> Downlink:
    body = dict(message.body)
    if client != BROADCAST:
        return Downlink(message.round, body)
    if PERSONAL_LIST not in body:
        raise WireError("missing_field", f"a broadcast downlink lacks '{PERSONAL_LIST}'")
    personal_for = client_ids(PERSONAL_LIST, body.pop(PERSONAL_LIST))
    return Downlink(message.round, body, personal_for)


@dataclass
class DownlinkPayloads:
    """One round's downlinks, encoded once: published, checkpointed and re-published as is."""

    broadcast: bytes
    personal: dict[str, bytes] = field(default_factory=dict)


def encode_downlinks(
    run: str, t: int, broadcast: Mapping[str, Any], personal: Mapping[str, Mapping[str, Any]]
) -> DownlinkPayloads:
    return DownlinkPayloads(
        Downlink(t, broadcast, tuple(sorted(personal))).encode(run),
        {client: Downlink(t, body).encode(run) for client, body in personal.items()},
    )
