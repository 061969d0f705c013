"""``--input mqtt:TOPIC``: a gateway's frames to windows, with bounded work under a flood.

A gateway sends one frame per packet, 20 to 1,000 a second. Something else on the topic
(a gateway gone wrong, a device with valid credentials and bad intent) may send ten
thousand a second, more than a device can cut into windows. Three rules keep the sensor
alive then:

* **Bounded, the oldest dropped.** Frames wait in a bounded buffer
  (:class:`~mqttfl.sensing.inlet.FrameBuffer`) that makes room by dropping its oldest,
  counted here as ``overflow``: memory stays bounded and what is read is what arrived
  last. A window is cut from consecutive frames only: after a loss the next window
  starts afresh.
* **Reading before cutting.** Frames are cut in batches (all that wait, at once, but no
  more than the newest ``BATCH_WINDOWS`` windows' worth: older ones are dropped as
  ``overflow`` too), and after each batch the loop pauses as long as the batch took (20
  ms at least), so the reading thread gets at least half the time: a flood piles up in
  the buffer, where it is dropped, not in the broker's queue or the socket, where it
  would delay every reading after the flood ends. Measured (benchmarks/
  bench_sense_flood.py): 10,000 frames/s for 60 s, RSS 90 MB before, 91 MB at its peak,
  the first reading of frames sent after the flood 0.3 s after it.
* **Out-of-range frames refused in bursts.** A frame holding an I/Q value its radio
  cannot report (:func:`~mqttfl.sensing.frames.iq_range`) is dropped and counted as
  ``range``, with one line when such a run of frames begins (not one per frame; at most
  one every ``OVERFLOW_REPORT_S``) and a ``frames.refused`` event with its length when a
  frame in range ends it.
* **Time checked.** A frame's ``t`` is used when it is a plausible time: not before
  2000-01-01 and at most a day ahead of when the frame arrived. Any other stamp (``1e12``,
  ``-1e18``: a clock never set, a counter, a forgery) is replaced by the frame's received
  time, counted as ``restamped``; the frame itself is kept, since its CSI is as good as
  any. So no stamp can reach the time formatting out of its range.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import numpy as np

from mqttfl.bus.transport import Incoming
from mqttfl.data.capture import fft_order_index
from mqttfl.errors import DataError, FrameError
from mqttfl.logs import get_logger
from mqttfl.sensing.frames import decode_frame
from mqttfl.sensing.pipeline import Window, Windower, frame_rows
from mqttfl.sensing.spec import Preprocess

BATCH_WINDOWS = 4  # windows' worth of frames cut per batch, at most
MIN_PAUSE_S = 0.02  # a window of 24 packets at 20 Hz lasts 60 times longer
MAX_PAUSE_S = 0.05  # the longest pause after a batch (one of 128 frames takes ~4 ms)
EARLIEST_STAMP = 946_684_800.0  # 2000-01-01T00:00:00Z: no CSI capture is older
LATEST_AHEAD_S = 86_400.0  # a stamp a day past its arrival is a wrong clock
REPORTED_DROPS = 5  # per reason, a line for each of the first few, then every 100th
OVERFLOW_REPORT_S = 10.0  # while frames overflow, a line this often at most


class FrameSource(Protocol):
    """Where frames come from (:class:`~mqttfl.sensing.inlet.FrameInlet`, or a test's)."""

    @property
    def dropped(self) -> int:
        """Frames dropped so far to keep the source's bound."""
        ...

    @property
    def max_frames(self) -> int: ...

    async def take(self) -> list[Incoming]:
        """Every frame waiting, oldest first (waits for one)."""
        ...


def frame_time(stamp: float | None, received: float) -> float | None:
    """The frame's own time when it is plausible (see the module's docstring), else
    None: the caller uses ``received``."""
    if stamp is None or not EARLIEST_STAMP <= stamp <= received + LATEST_AHEAD_S:
        return None
    return stamp


class GatewayFrames:
    """Windows of the frames on ``topic``; ``dropped`` counts lost frames by reason (the
    sensor's tally) and ``say`` writes a line for a person."""

    def __init__(
        self,
        pre: Preprocess,
        topic: str,
        *,
        source: FrameSource,
        dropped: Counter[str],
        say: Callable[[str], None],
    ) -> None:
        self.pre, self.topic = pre, topic
        self.source = source
        self.dropped, self.say = dropped, say
        self.frames = 0  # taken from the source, in the order they arrived
        self.restamped = 0
        self._windower = Windower(pre)
        self._index: np.ndarray | None = None
        self._overflow_seen = 0
        # A batch longer than this is cut from its newest frames (the rest are older than
        # a few windows: readings of a moment past).
        self.batch_frames = max(BATCH_WINDOWS * max(pre.window, pre.stride), 128)
        self._overflow_said: float | None = None  # when the last overflow line was written
        self.refusing = 0  # frames out of range since the last frame in range
        self._refusal_said: float | None = None  # bursts: a line every OVERFLOW_REPORT_S at most
        self.log = get_logger(component="sense", topic=topic)

    async def windows(self) -> AsyncIterator[Window]:
        while True:
            batch = await self.source.take()
            started = time.monotonic()
            behind = len(batch) - self.batch_frames  # the newest few windows are enough
            if behind > 0:
                batch = batch[behind:]
            self._overflow(max(behind, 0))
            for window in self._cut(batch):
                yield window
            # Let the reading thread run at least as long as this batch took to cut, and
            # gather a few frames before the next batch (not one wake-up per frame).
            busy = time.monotonic() - started
            await asyncio.sleep(min(max(busy, MIN_PAUSE_S), MAX_PAUSE_S))

    # --- a batch ------------------------------------------------------------------------
    def _cut(self, batch: list[Incoming]) -> Iterator[Window]:
        offset = time.time() - time.monotonic()  # received (monotonic) to wall-clock time
        group: list[tuple[int, np.ndarray, float]] = []  # consecutive frames of one shape
        for message in batch:
            if message.topic != self.topic:
                continue
            self.frames += 1
            try:
                if message.error is not None:
                    raise FrameError("malformed", str(message.error))
                csi, stamp = decode_frame(message.payload, self.pre)
            except FrameError as exc:
                if exc.reason == "range":
                    self._refuse(str(exc), self.frames)
                else:
                    self._drop(exc.reason, str(exc), self.frames)
                continue
            self._refused_until(self.frames)
            received = message.received + offset
            when = frame_time(stamp, received)
            if when is None and stamp is not None:
                self._restamp(stamp, self.frames)
            if group and group[0][1].shape != csi.shape:
                yield from self._rows(group)
                group = []
            group.append((self.frames, csi, received if when is None else when))
        if group:
            yield from self._rows(group)

    def _rows(self, group: list[tuple[int, np.ndarray, float]]) -> Iterator[Window]:
        """Feature rows of frames of one shape, at once (as per packet: no row depends on
        another), pushed through the windower in order."""
        subcarriers = group[0][1].shape[0]
        if self._index is None or len(self._index) != subcarriers:
            self._index = fft_order_index(subcarriers) if subcarriers == 64 else None
        try:
            rows = frame_rows(np.stack([csi for _, csi, _ in group]), self.pre, self._index)
        except DataError as exc:
            for number, _, _ in group:
                self._drop("shape", str(exc), number)
            return
        for row, (_, _, when) in zip(rows, group, strict=True):
            window = self._windower.push(row, when)
            if window is not None:
                yield window

    # --- what is lost, counted and said -------------------------------------------------
    def _overflow(self, behind: int) -> None:
        """Count the frames the source dropped and those ``behind`` the newest of a batch;
        the next window starts after them."""
        lost = self.source.dropped - self._overflow_seen + behind
        if not lost:
            return
        self._overflow_seen = self.source.dropped
        self._windower.reset()
        self.dropped["overflow"] += lost
        now, last = time.monotonic(), self._overflow_said
        if last is not None and now - last < OVERFLOW_REPORT_S:
            return
        self._overflow_said = now
        if last is None:
            self.say(
                f"frames on {self.topic} arrive faster than they can be read: the newest "
                f"are read, the oldest dropped (overflow)"
            )
        else:
            self.say(f"{self.dropped['overflow']} frames on {self.topic} dropped so far (overflow)")

    def _drop(self, reason: str, detail: str, number: int) -> None:
        self.dropped[reason] += 1
        n = self.dropped[reason]
        if n <= REPORTED_DROPS or n % 100 == 0:
            self.say(f"dropped frame {number} on {self.topic}: {detail} ({n} dropped for {reason})")

    def _refuse(self, detail: str, number: int) -> None:
        """A frame out of its radio's range: counted; one line per burst of them."""
        self.dropped["range"] += 1
        now, last = time.monotonic(), self._refusal_said
        if not self.refusing and (last is None or now - last >= OVERFLOW_REPORT_S):
            self._refusal_said = now
            self.say(
                f"refusing frames on {self.topic} from frame {number}: {detail} (dropped, "
                "counted as range; one line per burst)"
            )
        self.refusing += 1

    def _refused_until(self, number: int) -> None:
        if self.refusing:
            self.log.info("frames.refused", frames=self.refusing, until=number, reason="range")
            self.refusing = 0

    def _restamp(self, stamp: float, number: int) -> None:
        self.restamped += 1
        n = self.restamped
        if n <= REPORTED_DROPS or n % 100 == 0:
            self.say(
                f"frame {number} on {self.topic} is stamped t={stamp:.6g}, not a time near its "
                f"arrival (2000 to a day ahead): its received time is used ({n} so far)"
            )
