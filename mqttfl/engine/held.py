"""Uploads held for their sender's status: after a coordinator restarts, an upload sent
(or queued by the broker) before the crash can reach it before its sender's ``online``
status does. Refused as from an unknown client, it would be lost: a buffered upload of
an older version is never asked for again. So an upload from a client the checkpoint
knows, that has not announced itself yet, waits here (a bounded number per client and
in all) and is decided when the status arrives."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

PER_CLIENT = 8  # more than max_staleness + 1 uploads of one client cannot all count anyway
MAX_HELD = 4096


@dataclass(frozen=True)
class HeldUpload:
    round: int
    raw: bytes
    wire_bytes: int


@dataclass
class HeldUploads:
    by_client: defaultdict[str, list[HeldUpload]] = field(default_factory=lambda: defaultdict(list))

    def __len__(self) -> int:
        return sum(len(held) for held in self.by_client.values())

    def hold(self, t: int, client: str, raw: bytes, wire_bytes: int) -> bool:
        """Keep round t's upload of ``client`` for later; False when there is no room."""
        held = self.by_client[client]
        if len(held) >= PER_CLIENT or len(self) >= MAX_HELD:
            return False
        held.append(HeldUpload(t, raw, wire_bytes))
        return True

    def take(self, client: str) -> list[HeldUpload]:
        """``client``'s held uploads, oldest round first, and forget them."""
        return sorted(self.by_client.pop(client, []), key=lambda h: h.round)
