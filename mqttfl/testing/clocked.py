"""A federation on the engine's test clock: the coordinator's own engine (rounds or
buffered, :func:`mqttfl.engine.buffered.engine_for`), the methods' real client sides
training on real shards, every message through the real codec and readers, and no
broker: time is a fake clock that jumps from event to event.

Each client takes ``seconds[client]`` of simulated time per local training (a slow
device: 5× a fast one's), measured or given; training itself runs for real, in this
process, one client at a time, so results are the method's and only the clock is
simulated. A client behaves as :class:`~mqttfl.nodes.client.ClientRunner` does: it takes
the starts that select it in order (in buffered mode only the newest one), skips one
whose deadline passed while it was busy, uploads when its training time is over, then
applies the downlinks that arrived meanwhile (each evaluated on its test split, its
metrics sent to the engine). Communication takes no simulated time.

Used by the buffered mode's clock tests and ``benchmarks/bench_buffered.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.algorithms.base import ClientSide
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.engine.actions import Announce, Close, Finish
from mqttfl.engine.buffered import engine_for
from mqttfl.engine.documents import RunSummary
from mqttfl.engine.journal import LAST_ROUNDS as LAST
from mqttfl.engine.rounds import RoundEngine
from mqttfl.errors import RejectedUpload
from mqttfl.nodes.device import build_client_side, round_rng
from mqttfl.training.metrics import classification_report
from mqttfl.wire import Message, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    RoundStart,
    read_ack,
    read_metrics,
    read_start,
    read_status,
)
from mqttfl.wire.downlinks import read_downlink


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Device:
    side: ClientSide
    starts: list[tuple[RoundStart, float]] = field(default_factory=list)  # (start, received)
    busy_until: float | None = None
    upload: tuple[int, bytes] | None = None  # (round, encoded) sent when busy_until comes
    downlinks: list[Close] = field(default_factory=list)  # arrived while busy
    accuracy: list[float] = field(default_factory=list)  # after each applied downlink
    alive: bool = True


@dataclass
class Trace:
    """What a run did, on the simulated clock (seconds since its start)."""

    closes: list[tuple[float, int, float]] = field(default_factory=list)  # (t, version, acc)
    # at each close: the mean over clients of each one's last 5 accuracies (summary.json's)
    smoothed: list[float] = field(default_factory=list)
    uploads: list[tuple[float, str, int, int]] = field(
        default_factory=list
    )  # t, client, round, bytes
    rejected: list[tuple[float, str, int, str]] = field(default_factory=list)  # ..., reason
    down_bytes: list[int] = field(default_factory=list)  # per client-downlink
    summary: RunSummary | None = None
    compute_s: float = 0.0  # real seconds spent training and evaluating


class ClockedFederation:
    def __init__(
        self,
        config: RunConfig,
        shards: dict[str, Shard],
        *,
        seconds: Callable[[str, float], float] | None = None,
    ) -> None:
        """``seconds(client, measured)``: the simulated seconds of a local training, given
        the real seconds it took (default: those)."""
        torch.set_num_threads(config.train.torch_threads)  # as the client runner does
        self.config = config
        self.clock = FakeClock()
        self.began = self.clock.now
        algorithm = get_algorithm(config.method)
        ctx = make_context(config)
        self.engine: RoundEngine = engine_for(config)(config, algorithm, ctx, clock=self.clock)
        self.seconds = seconds or (lambda client, measured: measured)
        self.buffered = config.federation.mode == "buffered"
        self.devices: dict[str, Device] = {}
        self.trace = Trace()
        for cid, shard in shards.items():
            side = build_client_side(config, algorithm, ctx, cid, shard)
            self.devices[cid] = Device(side)
            self.announce(cid)

    @property
    def run_id(self) -> str:
        return self.config.run_id

    def now(self) -> float:
        return self.clock.now - self.began

    def announce(self, cid: str) -> None:
        self.devices[cid].alive = True
        raw = Online(self.devices[cid].side.info).encode(self.run_id)
        self.engine.on_status(read_status(raw, run_id=self.run_id, client=cid))

    def kill(self, cid: str) -> None:
        """Its last will: it is gone, and what it was training is lost."""
        device = self.devices[cid]
        device.alive, device.busy_until, device.upload, device.starts = False, None, None, []
        raw = Offline(cid, "connection lost").encode(self.run_id)
        self.engine.on_status(read_status(raw, run_id=self.run_id, client=cid))

    # --- the clients -------------------------------------------------------------------
    def _on_start(self, announce: Announce) -> None:
        start = read_start(
            announce.start.encode(self.run_id), run_id=self.run_id, round=announce.start.round
        )
        for cid in start.selected:
            device = self.devices.get(cid)
            if device is None or not device.alive:
                continue
            ack = Ack(start.round, cid, start.announcement).encode(self.run_id)
            self.engine.on_ack(read_ack(ack, run_id=self.run_id, round=start.round, client=cid))
            device.starts.append((start, self.clock.now))

    def _begin(self, cid: str, device: Device) -> None:
        """An idle device takes its next start (the newest, in buffered mode)."""
        while device.starts and device.busy_until is None:
            start, received = device.starts.pop(0)
            if self.buffered and device.starts:
                continue  # a newer version is there: train on that one
            if cid in start.uploaded or self.clock.now > received + start.timeout_s:
                continue
            side, t = device.side, start.round
            began = time.perf_counter()
            side.train(t, dict(start.params), round_rng(self.config.seed, side.info, t))
            body = side.make_upload(t)
            spent = time.perf_counter() - began
            self.trace.compute_s += spent
            took = self.seconds(cid, spent)
            raw = encode(Message("upload", self.run_id, t, cid, dict(body)))
            device.busy_until, device.upload = self.clock.now + took, (t, raw)

    def _finish(self, cid: str, device: Device) -> None:
        assert device.upload is not None
        t, raw = device.upload
        device.busy_until, device.upload = None, None
        try:
            self.engine.on_upload(t, cid, raw)
            self.trace.uploads.append((self.now(), cid, t, len(raw)))
        except RejectedUpload as exc:
            self.trace.rejected.append((self.now(), cid, t, exc.reason))
        pending, device.downlinks = device.downlinks, []
        for close in pending:
            self._apply(cid, device, close)

    def _apply(self, cid: str, device: Device, close: Close) -> None:
        t, run = close.round, self.run_id
        broadcast = read_downlink(close.payloads.broadcast, run_id=run, round=t, client="all")
        personal = None
        raw = close.payloads.personal.get(cid)
        if raw is not None:
            personal = dict(read_downlink(raw, run_id=run, round=t, client=cid).body)
        self.trace.down_bytes.append(len(close.payloads.broadcast) + len(raw or b""))
        side = device.side
        began = time.perf_counter()
        side.check_downlink(dict(broadcast.body), None)
        side.check_downlink({}, personal)
        side.receive(t, dict(broadcast.body), personal)
        report = classification_report(side.shard.y_test, side.predict(side.shard.x_test))
        self.trace.compute_s += time.perf_counter() - began
        device.accuracy.append(report["accuracy"])
        metrics = Metrics(t, cid, {**report, "num_test": len(side.shard.y_test)}).encode(run)
        self.engine.on_metrics(read_metrics(metrics, run_id=run, round=t, client=cid))

    def _on_close(self, close: Close) -> None:
        for cid, device in self.devices.items():
            if not device.alive:
                continue
            if device.busy_until is None:
                self._apply(cid, device, close)
            else:
                device.downlinks.append(close)
        scored = [d.accuracy for d in self.devices.values() if d.accuracy]
        newest = float(np.mean([a[-1] for a in scored]))
        self.trace.closes.append((self.now(), close.round, newest))
        self.trace.smoothed.append(float(np.mean([np.mean(a[-LAST:]) for a in scored])))

    # --- driving -----------------------------------------------------------------------
    def step(self) -> bool:
        """One engine step and the devices' answers; then the clock jumps to the next
        event (a device done training, an engine timer). False once the run finished."""
        for action in self.engine.step():
            if isinstance(action, Announce):
                self._on_start(action)
            elif isinstance(action, Close):
                self._on_close(action)
            elif isinstance(action, Finish):
                self.trace.summary = action.summary
        if self.engine.finished:
            return False
        for cid, device in self.devices.items():
            if device.alive:
                self._begin(cid, device)
        busy = [d.busy_until for d in self.devices.values() if d.busy_until is not None]
        wake = self.engine.wake_at()
        nxt = min([*busy, *([wake] if wake is not None else [])])
        self.clock.now = max(self.clock.now, nxt)
        for cid, device in self.devices.items():
            if device.busy_until is not None and device.busy_until <= self.clock.now:
                self._finish(cid, device)
        return True

    def run(self, *, max_steps: int = 100_000) -> Trace:
        for _ in range(max_steps):
            if not self.step():
                return self.trace
        raise RuntimeError(f"the run did not finish in {max_steps} steps")

    def until(self, done: Callable[[ClockedFederation], bool], *, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if done(self) or not self.step():
                return
        raise RuntimeError(f"not done in {max_steps} steps")
