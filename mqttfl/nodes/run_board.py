"""The run's retained documents on the broker, as its coordinator keeps them: the run state
(the phase, the round, the devices throttled) and the manifest (the run's contract).

Each is published whole and retained, so a process that subscribes later gets the newest.
The state goes out one at a time, so that the newest is the one retained. The manifest
goes out again when a waiting device asks for it (by clearing its own status), at most
once a second: a broker whose retained store is node-local (a RabbitMQ cluster) holds it
only on the node it was published to.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import replace

from mqttfl.bus.transport import Bus
from mqttfl.wire import Topics
from mqttfl.wire.control import RunStatus
from mqttfl.wire.manifest import Manifest

MANIFEST_EVERY_S = 1.0  # at most this often again, however many devices ask


class RunBoard:
    def __init__(
        self,
        bus: Bus,
        topics: Topics,
        manifest: Manifest,
        *,
        throttled: Callable[[], tuple[str, ...]],
        instance: Callable[[], str],
        wake: asyncio.Event,
    ) -> None:
        self.bus = bus
        self.topics = topics
        self.run_id = topics.run_id
        self.manifest = manifest
        self._manifest_payload = manifest.encode(self.run_id)
        self._throttled = throttled
        self._instance = instance
        self._wake = wake  # the coordinator's loop: it answers a device that asked
        self.status: RunStatus | None = None  # the run state last published
        self._state_lock = asyncio.Lock()
        self._manifest_sent = -math.inf
        self._manifest_asked = False

    async def publish_state(self, status: RunStatus | None = None) -> None:
        """Publish the retained run state (``status``, or the last one again), with the
        devices named throttled so far."""
        async with self._state_lock:
            if status is not None:
                self.status = status
            if self.status is None:
                return
            self.status = replace(
                self.status,
                throttled=self._throttled(),
                instance=self._instance(),
                settings=self.manifest.digest,
            )
            await self.bus.publish(self.topics.state, self.status.encode(self.run_id), retain=True)

    async def publish_manifest(self) -> None:
        await self.bus.publish(self.topics.manifest, self._manifest_payload, retain=True)

    def manifest_asked(self) -> None:
        """A device waits for the manifest: the loop publishes it again (:meth:`answer`)."""
        self._manifest_asked = True
        self._wake.set()

    async def answer(self) -> float:
        """Publish the manifest if a device asked and a second has passed since the last
        time; when to look again (inf: nobody is waiting)."""
        if not self._manifest_asked:
            return math.inf
        now = time.monotonic()
        if now - self._manifest_sent < MANIFEST_EVERY_S:
            return self._manifest_sent + MANIFEST_EVERY_S
        self._manifest_asked, self._manifest_sent = False, now
        await self.publish_manifest()
        return math.inf
