"""Who a round asks (:func:`select_clients`) and who it stops waiting for early
(:class:`Refusals`: selected clients refused, or that cannot train).

A round waits for every selected client until it uploads, leaves, proves a ghost, or the
deadline passes. Two more answers end the wait for a client at once:

- the coordinator refused its upload for the open round (schema, bounds, envelope: any
  reason :class:`~mqttfl.engine.gate.UploadGate` gives once the round, the sender's
  selection and the absence of an accepted copy are established), or
- it said it cannot train the round: its own check refused what it trained (diverged
  weights past the method's bound), sent as an :class:`~mqttfl.wire.control.Ack`
  carrying ``cannot_train`` on its own acknowledgement topic.

Only the first refusal of each selected client counts, and only for that client: a
refused client that sends a hundred bad copies closes its own part of the round once and
nobody else's (the topic names the sender; the broker's ACL lets a client write only its
own topics). A refusal counts for every attempt of the round: a client that could not
train round t does not train it again on a retry (:mod:`mqttfl.nodes.client`).

A refused client may still upload a valid copy while the round is open, and it is taken:
the gate keeps no refusals (a refusal is not a ban); a refusal only closes that client's
part of the round early. Once every selected client has uploaded or been
refused, the round closes, and a valid copy after that is ``stale`` as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mqttfl.engine.gate import UploadGate
from mqttfl.wire.ids import client_order


def select_clients(
    live: list[str], *, fraction: float, min_clients: int, seed: int, t: int, attempt: int
) -> list[str]:
    """A seeded sample of ceil(fraction·|live|) clients, never fewer than min_clients."""
    k = min(len(live), max(min_clients, math.ceil(fraction * len(live))))
    rng = np.random.default_rng([seed, t, attempt])
    return sorted(rng.choice(sorted(live), size=k, replace=False).tolist(), key=client_order)


@dataclass
class Refusals:
    """The selected clients of round ``round`` that will not upload, with why."""

    round: int = 0
    reasons: dict[str, str] = field(default_factory=dict)

    def open(self, t: int) -> None:
        """Round t opens (a retry of the same round keeps what was refused)."""
        if t != self.round:
            self.round, self.reasons = t, {}

    def add(self, gate: UploadGate, t: int, client: str, reason: str) -> bool:
        """Count ``client``'s refusal in round t; False unless t is the gate's open round,
        the client is selected in it and has no accepted upload, and this is its first."""
        if t != self.round or not gate.open or t != gate.round or client in self.reasons:
            return False
        if client not in gate.selected or client in gate.accepted:
            return False
        self.reasons[client] = reason
        return True

    def __contains__(self, client: object) -> bool:
        return client in self.reasons

    def among(self, clients: list[str]) -> list[str]:
        return [c for c in clients if c in self.reasons]
