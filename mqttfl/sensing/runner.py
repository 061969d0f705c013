"""The sensing loop: windows from a source, one reading each, published to the broker.

Sources (``--input``):

* a capture file in any ``data prepare`` format, replayed at its recorded packet rate
  (``--fast``: as fast as it goes);
* ``mqtt:TOPIC``: a gateway's frames, one packet per message (:mod:`.frames`);
* ``shard:PATH``: a shard's test split, windows ready for the model (``--eval`` scores
  them against their labels, in the batches the run evaluated with).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus
from mqttfl.data.capture import fft_order_index
from mqttfl.errors import DataError, MqttflError
from mqttfl.logs import get_logger
from mqttfl.sensing.frames import FrameError, decode_frame
from mqttfl.sensing.model import Reading, SensorModel
from mqttfl.sensing.pipeline import Window, Windower, capture_rows, frame_rows
from mqttfl.sensing.publish import (
    OFFLINE,
    ONLINE,
    SensorTopics,
    discovery_config,
    encode,
    package_version,
    state_message,
)
from mqttfl.sensing.replay import guess_format, read_capture_file, read_shard, replay_rate
from mqttfl.sensing.spec import SensorSpec, load_spec
from mqttfl.training.metrics import classification_report

REPORTED_DROPS = 5  # per reason, a line for each of the first few, then every 100th


@dataclass(frozen=True)
class Source:
    kind: str  # "capture", "mqtt" or "shard"
    target: str

    @classmethod
    def parse(cls, text: str) -> Source:
        if text.startswith("mqtt:"):
            topic = text[5:]
            if not topic or "#" in topic or "+" in topic:
                raise MqttflError(f"--input {text!r}: name one topic after mqtt:, no wildcards")
            return cls("mqtt", topic)
        if text.startswith("shard:"):
            return cls("shard", text[6:])
        return cls("capture", text)


@dataclass
class SenseOptions:
    directory: Path
    source: Source
    broker: BrokerAddress | None = None
    credentials: Credentials | None = None
    name: str | None = None
    discovery_prefix: str = "homeassistant"
    once: bool = False
    fast: bool = False
    evaluate: bool = False
    json_lines: bool = False
    rate: float | None = None
    capture_format: str | None = None
    nexmon_chip: str | None = None
    nexmon_bw: int | None = None
    max_readings: int | None = None
    connect_timeout_s: float = 10.0
    threads: int = 1


@dataclass
class Tally:
    readings: int = 0
    frames: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    first_reading_s: float | None = None


class Sensor:
    def __init__(
        self, options: SenseOptions, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr
    ):
        self.options = options
        self.out, self.err = out, err
        self.tally = Tally()
        self.spec: SensorSpec = load_spec(options.directory)
        self.model = SensorModel(options.directory, self.spec, threads=options.threads)
        from mqttfl.sensing.publish import check_name, default_name

        self.topics = SensorTopics(
            check_name(options.name or default_name(self.spec)), options.discovery_prefix
        )
        self.live = out.isatty() and not options.json_lines and not options.once
        self.bus: Bus | None = None
        self.log = get_logger(component="sense", sensor=self.topics.name)
        self._check_source()

    # --- set-up -----------------------------------------------------------------------
    def _check_source(self) -> None:
        """Fail before connecting when the source cannot work (each a line naming it)."""
        o = self.options
        if o.evaluate and o.source.kind != "shard":
            raise MqttflError("--eval needs --input shard:PATH (labelled windows)")
        if o.broker is None and not o.evaluate:
            raise MqttflError(
                "--broker is required (the readings go there), e.g. mqtt://127.0.0.1:1883"
            )
        if o.source.kind == "mqtt" and o.broker is None:
            raise MqttflError("--input mqtt:TOPIC needs --broker")
        if o.source.kind == "capture":
            path = Path(o.source.target)
            if not path.is_file():
                raise DataError(path, "capture file not found")
            if self.spec.preprocess.kind != "csi-windows":
                raise DataError(path, "the model reads feature vectors; give --input shard:PATH")
            self.capture_format = o.capture_format or guess_format(path, self.spec)
            self.capture = read_capture_file(
                path, self.capture_format, nexmon_chip=o.nexmon_chip, nexmon_bw=o.nexmon_bw
            )
            self.rows = capture_rows(self.capture, self.spec.preprocess)
            self.rate = None if o.fast else replay_rate(path, self.spec, o.rate)
        elif o.source.kind == "shard":
            self.shard = read_shard(Path(o.source.target), self.spec)
        elif self.spec.preprocess.kind != "csi-windows":
            raise MqttflError("--input mqtt:TOPIC needs a model that reads CSI windows")

    def _birth(self) -> list[tuple[str, bytes, bool]]:
        config = discovery_config(self.spec, self.topics, package_version())
        return [
            (self.topics.availability, ONLINE, True),
            (self.topics.discovery, encode(config), True),
        ]

    # --- sources ----------------------------------------------------------------------
    async def _capture_windows(self) -> AsyncIterator[Window]:
        windower = Windower(self.spec.preprocess)
        start = time.monotonic()
        for i, row in enumerate(self.rows):
            if self.rate is not None:
                delay = start + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            self.tally.frames += 1
            window = windower.push(row, time.time())
            if window is not None:
                yield window

    async def _mqtt_windows(self) -> AsyncIterator[Window]:
        assert self.bus is not None
        windower = Windower(self.spec.preprocess)
        topic = self.options.source.target
        index: np.ndarray | None = None
        while True:
            message = await self.bus.incoming.get()
            if message.topic != topic:
                continue
            self.tally.frames += 1
            try:
                if message.error is not None:
                    raise FrameError("malformed", str(message.error))
                csi, stamp = decode_frame(message.payload, self.spec.preprocess)
                if index is None or len(index) != csi.shape[0]:
                    index = fft_order_index(csi.shape[0]) if csi.shape[0] == 64 else None
                row = frame_rows(csi[None], self.spec.preprocess, index)[0]
            except (FrameError, DataError) as exc:
                reason = exc.reason if isinstance(exc, FrameError) else "shape"
                self._dropped(reason, str(exc))
                continue
            window = windower.push(row, stamp if stamp is not None else time.time())
            if window is not None:
                yield window

    def _dropped(self, reason: str, detail: str) -> None:
        self.tally.dropped[reason] += 1
        n = self.tally.dropped[reason]
        self.log.warning("frame.dropped", reason=reason, detail=detail, dropped=n)
        if n <= REPORTED_DROPS or n % 100 == 0:
            self._clear_live()
            self.err.write(
                f"mqttfl sense: dropped frame {self.tally.frames} on {self.options.source.target}: "
                f"{detail} ({n} dropped for {reason})\n"
            )
            self.err.flush()

    async def _shard_windows(self) -> AsyncIterator[Window]:
        for x, y in zip(self.shard.x_test, self.shard.y_test, strict=True):
            self.tally.frames += 1
            yield Window(x, time.time(), int(y))
            await asyncio.sleep(0)

    def _windows(self) -> AsyncIterator[Window]:
        kind = self.options.source.kind
        if kind == "capture":
            return self._capture_windows()
        if kind == "mqtt":
            return self._mqtt_windows()
        return self._shard_windows()

    # --- output -----------------------------------------------------------------------
    async def _publish(self, reading: Reading) -> dict[str, Any]:
        state = state_message(reading)
        if self.bus is not None:
            await self.bus.publish(self.topics.state, encode(state), qos=1, timeout=30.0)
        self.tally.readings += 1
        if self.tally.first_reading_s is None:
            self.tally.first_reading_s = time.monotonic() - self.tally.started
        return state

    def _show(self, state: dict[str, Any]) -> None:
        if self.options.json_lines:
            self.out.write(json.dumps(state) + "\n")
        elif self.live:
            dropped = sum(self.tally.dropped.values())
            self.out.write(
                f"\r{self.topics.name}: {state['count']} ({state['class']}, "
                f"{state['confidence']:.0%}) at {state['window_end']}  "
                f"readings {self.tally.readings}  dropped {dropped}   "
            )
        else:
            self.out.write(
                f"{state['window_end']} count={state['count']} class={state['class']} "
                f"confidence={state['confidence']:.4f}\n"
            )
        self.out.flush()

    def _clear_live(self) -> None:
        if self.live and self.tally.readings:
            self.out.write("\n")
            self.out.flush()

    # --- the loop -----------------------------------------------------------------------
    async def _sense(self) -> None:
        windows = self._windows()
        try:
            async for window in windows:
                reading = self.model.readings(window.x[None], [window.end_time])[0]
                self._show(await self._publish(reading))
                if self.options.once or (
                    self.options.max_readings is not None
                    and self.tally.readings >= self.options.max_readings
                ):
                    break
        finally:
            await windows.aclose()  # type: ignore[attr-defined]
        self._clear_live()

    async def _evaluate(self) -> dict[str, Any]:
        """Score the shard's test windows in the run's batches; publish each reading."""
        x, y = self.shard.x_test, self.shard.y_test
        batch = self.spec.eval_batch_size
        predicted: list[int] = []
        for start in range(0, len(x), batch):
            chunk = x[start : start + batch]
            readings = self.model.readings(chunk, [time.time()] * len(chunk))
            for reading in readings:
                predicted.append(reading.klass)
                if self.bus is not None:
                    await self._publish(reading)
                else:
                    self.tally.readings += 1
        report = classification_report(y, np.asarray(predicted, dtype=np.int64))
        return {**report, "windows": len(y), "run": self.spec.scores}

    def _write_evaluation(self, result: dict[str, Any]) -> None:
        if self.options.json_lines:
            self.out.write(json.dumps(result) + "\n")
            return
        run = result["run"]
        lines = [f"{'':10}{'run':>10}{'sense':>10}"]
        for key in ("accuracy", "f1", "mae"):
            mine = f"{result[key]:.4f}"
            theirs = f"{run[key]:.4f}" if key in run else "-"
            lines.append(f"{key:10}{theirs:>10}{mine:>10}")
        lines.append(
            f"{result['windows']} windows; run: round {run.get('round', '?')} of metrics.jsonl"
        )
        self.out.write("\n".join(lines) + "\n")

    async def run(self) -> int:
        o = self.options
        task: asyncio.Task[None] | None = None
        if o.broker is not None:
            subscriptions = [o.source.target] if o.source.kind == "mqtt" else []
            self.bus = Bus(
                o.broker,
                identifier=f"mqttfl-sense-{self.topics.node_id}",
                subscriptions=subscriptions,
                will=(self.topics.availability, OFFLINE),
                birth=self._birth,
                credentials=o.credentials,
                connect_timeout_s=o.connect_timeout_s,
            )
            task = asyncio.create_task(self.bus.run())
        try:
            if self.bus is not None:
                await self.bus.wait_connected(timeout=o.connect_timeout_s)
            self.log.info("sense.started", source=o.source.kind, target=o.source.target)
            if o.evaluate:
                self._write_evaluation(await self._evaluate())
            else:
                await self._sense()
            if self.bus is not None:
                await self.bus.publish(self.topics.availability, OFFLINE, retain=True, timeout=5.0)
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        dropped = sum(self.tally.dropped.values())
        if dropped:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(self.tally.dropped.items()))
            self.err.write(
                f"mqttfl sense: {self.tally.readings} readings, {dropped} frames dropped ({detail})\n"
            )
        return 0
