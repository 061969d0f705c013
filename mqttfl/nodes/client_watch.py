"""A client never outlives its run: it watches the run's lease (retained by the live
coordinator, cleared to ``live: false`` by its last will or its release) and its own
connection, and stops, saying so in one line, once the run has had no live coordinator,
or the client no broker, for ``broker.orphan_timeout_s`` (a run that finished ends the
client through its ``finished`` state, exit 0, long before)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from mqttfl.errors import StateError
from mqttfl.wire.lease import Lease

CHECK_EVERY_S = 1.0


class Connected(Protocol):
    def is_set(self) -> bool: ...


class RunWatch:
    def __init__(self, run_id: str, client_id: str, limit_s: float, connected: Connected) -> None:
        self.run_id, self.client_id, self.limit_s = run_id, client_id, limit_s
        self.connected = connected
        self.coordinator_live = False
        self.alone_since: float | None = None  # monotonic: since when nobody runs the run

    def on_lease(self, lease: Lease) -> None:
        self.coordinator_live = lease.live

    def on_coordinator(self) -> None:
        """A start, run state or downlink came: the coordinator is live (a broker whose
        retained store is node-local may never hand us its lease)."""
        self.coordinator_live = True

    def check(self, now: float) -> None:
        """StateError once the client has been alone for longer than its limit."""
        if self.coordinator_live and self.connected.is_set():
            self.alone_since = None
            return
        if self.alone_since is None:
            self.alone_since = now
            return
        if now - self.alone_since <= self.limit_s:
            return
        missing = "no live coordinator" if self.connected.is_set() else "no broker"
        raise StateError(
            f"client {self.client_id!r} stops: run {self.run_id!r} has had {missing} for "
            f"{self.limit_s:.0f} s (broker.orphan_timeout_s); start it again when the run "
            "goes on (it resumes from its state)"
        )

    async def run(self) -> None:
        while True:
            self.check(time.monotonic())
            await asyncio.sleep(min(CHECK_EVERY_S, self.limit_s / 4))
