"""A client's uploads on the wire: one at a time (the chunks of two would interleave),
the newest kept, so that it can be sent again when the coordinator asks for it (its
chunks could not be put together) or announces its round again without it (it restarted,
or the upload was lost while the broker restarted)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqttfl.bus.transport import Bus
from mqttfl.wire import Topics
from mqttfl.wire.control import RoundStart
from mqttfl.wire.resend import Resend

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger as BoundLogger

# Sends of one round's upload at the coordinator's request: a bound, so that requests
# cannot make a device send forever.
MAX_RESENDS_PER_ROUND = 20


@dataclass(frozen=True)
class SentUpload:
    round: int
    announcement: int  # of the start it answered
    payload: bytes
    sent: float  # monotonic
    message: int | None = None  # its chunked message's id (None: it went whole)


class Uploads:
    def __init__(self, bus: Bus, topics: Topics, client_id: str, log: BoundLogger) -> None:
        self.bus, self.topics, self.client_id, self.log = bus, topics, client_id, log
        self.last: SentUpload | None = None
        self._sending = asyncio.Lock()
        self._asked: dict[int, int] = {}  # round -> sends asked for by the coordinator

    def forget(self) -> None:
        """The run started again: nothing sent so far is of it."""
        self.last = None
        self._asked.clear()

    async def send(self, t: int, announcement: int, payload: bytes) -> None:
        async with self._sending:
            sent = await self.bus.publish(self.topics.up(t, self.client_id), payload)
            self.last = SentUpload(t, announcement, payload, time.monotonic(), sent)

    def should_resend(self, start: RoundStart, received: float, trained_round: int) -> bool:
        """Round t announced anew (a restarted coordinator, a retry) without our upload,
        which we had sent before this start arrived (so the two did not cross on the wire)."""
        if start.round != trained_round or self.client_id in start.uploaded:
            return False
        last = self.last
        if last is None or last.round != start.round:
            return True  # sent in an earlier life of this process
        return last.announcement != start.announcement and last.sent < received

    async def resend(
        self, start: RoundStart, received: float, rebuild: Callable[[], Awaitable[bytes | None]]
    ) -> None:
        """Send round t's upload again (``rebuild`` makes it anew from the model on disk
        when this process did not send it, or gives None: it cannot be sent again)."""
        t = start.round
        if time.monotonic() > received + start.timeout_s:
            return
        last = self.last
        payload = last.payload if last is not None and last.round == t else await rebuild()
        if payload is None:
            return
        await self.send(t, start.announcement, payload)
        self.log.info("upload.resent", round=t, bytes=len(payload), attempt=start.attempt)

    async def resend_asked(self, resend: Resend, closed_round: int) -> None:
        """The coordinator could not put our newest upload of round t together: send it
        again (after any send of ours still in progress), while round t is open. A request
        about an older send (or chunks that were never ours) is answered by the newer one."""
        t = resend.round
        async with self._sending:
            last = self.last
            if last is None or last.round != t or t <= closed_round:
                return  # nothing of ours for that round, or it is over
            if last.message != resend.message:
                return
            asked = self._asked.get(t, 0)
            if asked >= MAX_RESENDS_PER_ROUND:
                self.log.warning("upload.resend_refused", round=t, reason=resend.reason)
                return
            self._asked[t] = asked + 1
            message = await self.bus.publish(self.topics.up(t, self.client_id), last.payload)
            self.last = SentUpload(t, last.announcement, last.payload, time.monotonic(), message)
        self.log.info(
            "upload.resent", round=t, bytes=len(last.payload), reason=resend.reason, asked=asked + 1
        )
