"""The sensing loop: windows from a source, one reading each, published to the broker.

Sources (``--input``, one class each in :mod:`.source`):

* a capture file in any ``data prepare`` format, replayed at its recorded packet rate
  (``--fast``: as fast as it goes);
* ``mqtt:TOPIC``: a gateway's frames, one packet per message (:mod:`.frames`);
* ``shard:PATH``: a shard's test split, windows ready for the model (``--eval`` scores
  them against their labels, in the batches the run evaluated with).

A model that adapts (sensor.json's ``adaptation``: FedAPA-S) keeps a rolling buffer of
the latest windows and predicts each with the statistics and prototypes re-estimated on it
(:mod:`.adapt`); each reading says whether it was adapted and the gate's shift score.
``--eval`` adapts once on the whole session (the run's figure), ``--eval --stream`` in
stream order (:mod:`.adapt_eval`).

A window whose scores come out NaN or infinite is skipped and counted, never published
(strict JSON has no NaN). The availability topic says ``offline`` on every way out: the
end of the input, ``--once``/``--readings``, an error, SIGTERM or SIGINT (a clean stop:
exit 0 for SIGTERM, as a service manager expects, 130 for SIGINT), and the connection's
last will when the process dies without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiomqtt
import numpy as np

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus
from mqttfl.errors import BrokerError, DataError, MqttflError, UsageError
from mqttfl.logs import get_logger
from mqttfl.sensing import adapt_eval
from mqttfl.sensing.adapt import (
    DEFAULT_BUFFER,
    DEFAULT_EVERY,
    DEFAULT_HORIZON_S,
    Adaptation,
    StreamAdapter,
)
from mqttfl.sensing.gateway import REPORTED_DROPS, GatewayFrames
from mqttfl.sensing.identity import frames_note, refusal_hint, sensor_credentials
from mqttfl.sensing.inlet import FrameInlet
from mqttfl.sensing.model import Reading, SensorModel
from mqttfl.sensing.pipeline import Window, Windower, capture_rows
from mqttfl.sensing.publish import (
    OFFLINE,
    ONLINE,
    default_name,
    discovery_config,
    encode,
    iso_time,
    package_version,
    state_message,
)
from mqttfl.sensing.replay import guess_format, read_capture_file, read_shard, replay_rate
from mqttfl.sensing.source import CaptureSource, MqttSource, ShardSource, Source
from mqttfl.sensing.spec import SensorSpec, load_spec
from mqttfl.training.metrics import classification_report
from mqttfl.wire.sensors import SensorTopics

GOODBYE_S = 5.0  # to publish `offline` on the way out
STOP_CODES = {"SIGTERM": 0, "SIGINT": 130}  # the exit code after a clean stop


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
    buffer: int = DEFAULT_BUFFER  # an adapting model: windows in the rolling buffer
    horizon_s: float = DEFAULT_HORIZON_S  # and the oldest window's age
    every: int = DEFAULT_EVERY  # windows between two estimates
    stream: bool = False  # --eval: in stream order, not once on the whole session
    curve: Path | None = None  # --eval --stream: the curve's JSON file


@dataclass
class Tally:
    readings: int = 0
    frames: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # frames, by reason
    skipped: int = 0  # windows whose scores were not finite
    left_out: int = 0  # windows the estimate in force left out (an adapting model)
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
        try:
            name = options.name or default_name(self.spec)
            self.topics = SensorTopics(name, options.discovery_prefix)
        except ValueError as exc:  # a name or prefix no topic can hold: one line
            raise UsageError(str(exc)) from None
        self.credentials = sensor_credentials(options.credentials, self.topics)
        self.model = SensorModel(options.directory, self.spec, threads=options.threads)
        self.adapting: StreamAdapter | None = None
        if self.model.adapter is not None:
            self.adapting = StreamAdapter(
                self.model.adapter,
                buffer=options.buffer,
                horizon_s=options.horizon_s,
                every=options.every,
                on_estimate=self._adapted,
            )
        self.live = out.isatty() and not options.json_lines and not options.once
        self.bus: Bus | None = None
        self.gateway: GatewayFrames | None = None
        self.inlet: FrameInlet | None = None
        self.stopped_by: str | None = None  # the signal that stopped the sensor
        self.reading = not isinstance(options.source, MqttSource)  # False until subscribed
        self.log = get_logger(component="sense", sensor=self.topics.name)
        self._check_source()

    # --- set-up -----------------------------------------------------------------------
    def _check_source(self) -> None:
        """Fail before connecting when the source cannot work (each a line naming it)."""
        o = self.options
        if o.evaluate and not isinstance(o.source, ShardSource):
            raise UsageError("--eval needs --input shard:PATH (labelled windows)")
        if (o.stream or o.curve is not None) and not (o.evaluate and self.adapting):
            raise UsageError("--stream and --curve go with --eval of a model that adapts")
        least = self.spec.adaptation.min_adapt_windows if self.spec.adaptation else 0
        if o.buffer < least and not (o.evaluate and not o.stream):
            raise UsageError(
                f"--buffer {o.buffer} holds fewer windows than sensor.json's "
                f"adaptation.min_adapt_windows ({least}): the sensor would never adapt"
            )
        if o.broker is None and not o.evaluate:
            raise UsageError(
                "--broker is required (the readings go there), e.g. mqtt://127.0.0.1:1883"
            )
        windows = self.spec.preprocess.kind == "csi-windows"  # else feature vectors
        match o.source:
            case MqttSource() if o.broker is None:
                raise UsageError("--input mqtt:TOPIC needs --broker")
            case MqttSource() if not windows:
                raise UsageError("--input mqtt:TOPIC needs a model that reads CSI windows")
            case CaptureSource(target):
                path = Path(target)
                if not path.is_file():
                    raise DataError(path, "capture file not found")
                if not windows:
                    raise DataError(
                        path, "the model reads feature vectors; give --input shard:PATH"
                    )
                self.capture_format = o.capture_format or guess_format(path, self.spec)
                self.capture = read_capture_file(
                    path, self.capture_format, nexmon_chip=o.nexmon_chip, nexmon_bw=o.nexmon_bw
                )
                self.rows = capture_rows(self.capture, self.spec.preprocess)
                self.rate = None if o.fast else replay_rate(path, self.spec, o.rate)
            case ShardSource(target):
                self.shard = read_shard(Path(target), self.spec)

    def _birth(self) -> list[tuple[str, bytes, bool]]:
        """What every (re)connect publishes: the discovery config, and ``online`` once the
        sensor reads its input (a gateway's topic: once subscribed to it)."""
        config = discovery_config(self.spec, self.topics, package_version())
        birth = [(self.topics.discovery, encode(config), True)]
        if self.reading:
            birth.insert(0, (self.topics.availability, ONLINE, True))
        return birth

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

    def _say(self, text: str) -> None:
        """One line on stderr (under the live count, not over it)."""
        self._clear_live()
        self.err.write(f"mqttfl sense: {text}\n")
        self.err.flush()

    async def _shard_windows(self) -> AsyncIterator[Window]:
        for x, y in zip(self.shard.x_test, self.shard.y_test, strict=True):
            self.tally.frames += 1
            yield Window(x, time.time(), int(y))
            await asyncio.sleep(0)

    def _windows(self) -> AsyncIterator[Window]:
        match self.options.source:
            case CaptureSource():
                return self._capture_windows()
            case MqttSource():
                assert self.gateway is not None
                return self.gateway.windows()
            case ShardSource():
                return self._shard_windows()

    # --- output -----------------------------------------------------------------------
    async def _publish(self, reading: Reading) -> dict[str, object]:
        """Publish a reading (QoS 0: the next window's replaces it, and the loop never
        waits on the broker's acknowledgement, which a flood queues behind its frames)."""
        state = state_message(reading)
        if self.bus is not None:
            await self.bus.publish(self.topics.state, encode(state), qos=0, timeout=30.0)
        self.tally.readings += 1
        if self.tally.first_reading_s is None:
            self.tally.first_reading_s = time.monotonic() - self.tally.started
        return state

    def _show(self, state: Mapping[str, object]) -> None:
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
                reading = self._read(window)
                if not reading.finite:
                    self._skipped(reading)
                    continue
                self._show(await self._publish(reading))
                if self.options.once or (
                    self.options.max_readings is not None
                    and self.tally.readings >= self.options.max_readings
                ):
                    break
        finally:
            await windows.aclose()  # type: ignore[attr-defined]
            if self.adapting is not None:
                await self.adapting.settle()
        self._clear_live()

    def _read(self, window: Window) -> Reading:
        """One window's reading; an adapting model first adds it to its buffer."""
        if self.adapting is None:
            return self.model.readings(window.x[None], [window.end_time])[0]
        head = self.spec.output_name
        scores = self.adapting.read(window.x, window.end_time, head, background=True)
        figures = self.adapting.current.figures()
        return self.model.readings_of(scores[None], [window.end_time], **figures)[0]

    def _adapted(self, adaptation: Adaptation, seconds: float) -> None:
        self.log.info(
            "sense.adapted", windows=adaptation.windows, seconds=round(seconds, 4),
            left_out=adaptation.left_out, **adaptation.figures(),
        )  # fmt: skip
        if adaptation.left_out and not self.tally.left_out:  # a line when it begins
            self._say(
                f"the estimate left {adaptation.left_out} of the buffer's {adaptation.windows} "
                "windows out: far from the others (sensor.json adaptation.screen)"
            )
        self.tally.left_out = adaptation.left_out

    def _skipped(self, reading: Reading) -> None:
        self.tally.skipped += 1
        n = self.tally.skipped
        if n <= REPORTED_DROPS or n % 100 == 0:
            self._say(
                f"skipped the window ending {iso_time(reading.end_time)}: the model's scores "
                f"are not finite, nothing published ({n} skipped)"
            )

    async def _evaluate(self) -> dict[str, object]:
        """Score the shard's test windows in the run's batches; publish each reading."""
        x, y = self.shard.x_test, self.shard.y_test
        if self.adapting is not None:
            return await self._evaluate_adapting()
        batch = self.spec.eval_batch_size
        predicted: list[int] = []
        for start in range(0, len(x), batch):
            chunk = x[start : start + batch]
            readings = self.model.readings(chunk, [time.time()] * len(chunk))
            for reading in readings:
                predicted.append(reading.klass)
                await self._emit(reading)
        report = classification_report(y, np.asarray(predicted, dtype=np.int64))
        return {**report, "windows": len(y), "run": self.spec.scores}

    async def _emit(self, reading: Reading) -> None:
        """An evaluated reading: skipped when not finite, else published (or counted)."""
        if not reading.finite:
            self._skipped(reading)
        elif self.bus is not None:
            await self._publish(reading)
        else:
            self.tally.readings += 1

    async def _evaluate_adapting(self) -> dict[str, object]:
        """Once on the whole session, or in stream order (:mod:`.adapt_eval`); each
        reading published."""
        assert self.adapting is not None
        o, y = self.options, self.shard.y_test
        result = adapt_eval.evaluate(
            self.adapting, self.spec, self.shard.x_test, y, o.stream, o.curve
        )
        now = [time.time()] * len(y)
        for reading in self.model.readings_of(result.scores, now, **result.adaptation.figures()):
            await self._emit(reading)
        report = classification_report(y, result.predicted)
        return {**report, "windows": len(y), "run": self.spec.scores, **result.summary}

    def _write_evaluation(self, result: dict[str, Any]) -> None:
        text = json.dumps(result) if self.options.json_lines else adapt_eval.table(result)
        self.out.write(text + "\n")

    async def _work(self) -> None:
        o = self.options
        if self.bus is not None:
            await self.bus.wait_connected(timeout=o.connect_timeout_s)
        if isinstance(o.source, MqttSource):
            await self._open_inlet()
        self.log.info("sense.started", source=o.source.kind, target=o.source.target)
        if o.evaluate:
            self._write_evaluation(await self._evaluate())
        else:
            await self._sense()

    async def _open_inlet(self) -> None:
        """The gateway's frames, on a connection of their own (:mod:`.inlet` says why),
        in the MQTT version the bus found the broker speaks; ``online`` once subscribed."""
        o = self.options
        assert o.broker is not None
        assert self.bus is not None
        note = frames_note(self.credentials.username, self.topics, o.source.target)
        if note is not None:
            self._say(note)
        self.inlet = FrameInlet(
            o.broker,
            self.credentials,
            topic=o.source.target,
            client_id=f"{self.topics.client_id}.frames",
            mqtt5=self.bus.protocol is aiomqtt.ProtocolVersion.V5,
        )
        self.gateway = GatewayFrames(
            self.spec.preprocess,
            o.source.target,
            source=self.inlet,
            dropped=self.tally.dropped,
            say=self._say,
        )
        self.inlet.start()
        await self.inlet.wait_subscribed(timeout=o.connect_timeout_s)
        self.reading = True
        await self.bus.publish(
            self.topics.availability, ONLINE, retain=True, timeout=o.connect_timeout_s
        )

    def _connect(self) -> Bus:
        o = self.options
        assert o.broker is not None
        return Bus(
            o.broker,
            identifier=self.topics.client_id,
            subscriptions=[],
            will=(self.topics.availability, OFFLINE),
            birth=self._birth,
            credentials=self.credentials,
            connect_timeout_s=o.connect_timeout_s,
            who=f"sensor {self.topics.name!r}",
            refusal_hint=refusal_hint(self.credentials.username, self.topics),
        )

    async def run(self) -> int:
        """Sense until the input ends, ``--once``/``--readings``, an error or a signal;
        ``offline`` is published on each way out (then the summary, then the error)."""
        if self.options.broker is None:  # --eval on a shard, printed only
            await self._work()
            self._summary()
            return 0
        self.bus = self._connect()
        connection = asyncio.create_task(self.bus.run())
        work = asyncio.create_task(self._work())
        signals = self._catch_signals(work)
        try:
            await asyncio.wait({connection, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for signum in signals:
                asyncio.get_running_loop().remove_signal_handler(signum)
            if not work.done():
                work.cancel()
            await asyncio.wait({work})
            await self._goodbye(connection)
            if not work.cancelled():
                work.exception()  # seen: raised below, unless this task is being cancelled
        self._summary()
        if self.stopped_by is not None:
            return STOP_CODES[self.stopped_by]
        error = None if connection.cancelled() else connection.exception()  # a refusal
        if error is None and not work.cancelled():
            error = work.exception()
        if error is not None:
            raise error
        if work.cancelled():  # the connection ended without a word (Bus.run never does)
            raise BrokerError(f"the connection to {self.options.broker} ended")
        return 0

    def _catch_signals(self, work: asyncio.Task[None]) -> list[int]:
        """SIGTERM and SIGINT stop the work cleanly (the way out publishes `offline`)."""
        loop = asyncio.get_running_loop()
        caught: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):

            def stop(name: str = signum.name) -> None:
                self.stopped_by = name
                work.cancel()

            try:
                loop.add_signal_handler(signum, stop)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                continue
            caught.append(signum)
        return caught

    async def _goodbye(self, connection: asyncio.Task[None]) -> None:
        """``offline`` (retained) while still connected, then the connection closed. If it
        cannot be sent, the broker has lost the connection and published the last will."""
        assert self.bus is not None
        if self.inlet is not None:
            self.inlet.stop()
        if self.bus.connected.is_set() and not connection.done():
            with contextlib.suppress(MqttflError):
                await self.bus.publish(
                    self.topics.availability, OFFLINE, retain=True, timeout=GOODBYE_S
                )
        connection.cancel()
        await asyncio.wait({connection})

    def _summary(self) -> None:
        dropped = sum(self.tally.dropped.values())
        restamped = self.gateway.restamped if self.gateway is not None else 0
        if not (dropped or restamped or self.tally.skipped or self.stopped_by):
            return
        parts = [f"{self.tally.readings} readings"]
        if dropped:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(self.tally.dropped.items()))
            parts.append(f"{dropped} frames dropped ({detail})")
        if restamped:
            parts.append(f"{restamped} frames stamped with their received time")
        if self.tally.skipped:
            parts.append(f"{self.tally.skipped} windows skipped (scores not finite)")
        stopped = f"stopped by {self.stopped_by}: " if self.stopped_by else ""
        self._clear_live()
        self.err.write(f"mqttfl sense: {stopped}{', '.join(parts)}\n")
        self.err.flush()
