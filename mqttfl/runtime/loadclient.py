"""A LOAD client without torch models: many simulated devices in one process, for fan-in drills.

This is not a federated-learning client: it builds no model and trains nothing (the
``mqttfl`` package import still loads torch once per process; nothing here uses it). Each simulated device has
its own MQTT session (a :class:`~mqttfl.runtime.transport.Bus`: retained ``online``
status, last will), and when selected uploads a valid prototype payload (random float32
prototypes for its classes, see :func:`mqttfl.algorithms.fedapa.prototype_schema`). All
selected devices upload at the same instant, behind a barrier. It applies nothing from
the downlinks; it answers each round's broadcast with placeholder metrics (marked
``load_client``) so the coordinator's accounting and summary stay complete.

Run: ``python -m mqttfl.runtime.loadclient --broker mqtt://127.0.0.1:1883 --clients 100
--config configs/fedapa-csi.toml [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mqttfl.config import RunConfig, load_config
from mqttfl.errors import MqttflError, WireError
from mqttfl.logs import configure_logging, get_logger
from mqttfl.runtime.transport import BrokerAddress, Bus, Credentials
from mqttfl.wire import Message, Topics, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    RoundStart,
    read_downlink,
    read_run_status,
    read_start,
)
from mqttfl.wire.schemas import ClientInfo

BARRIER_S = 2.0  # how long the first selected device waits for the others before all upload


def load_ids(count: int, prefix: str = "load") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


def prototype_upload(
    run: str, t: int, client_id: str, classes: list[int], embed_dim: int, rng: np.random.Generator
) -> bytes:
    body = {
        "classes": np.asarray(classes, np.int64),
        "prototypes": rng.standard_normal((len(classes), embed_dim)).astype(np.float32),
    }
    return encode(Message("upload", run, t, client_id, body))


@dataclass
class Device:
    client_id: str
    bus: Bus
    classes: list[int]
    uploaded: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)


class LoadFleet:
    """``count`` simulated devices sharing one event loop and one upload barrier."""

    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        ids: list[str],
        *,
        credentials: Credentials | None = None,
    ) -> None:
        self.config = config
        self.topics = Topics(config.run_id)
        self.log = get_logger(run_id=config.run_id, client_id="loadclient")
        self.rng = np.random.default_rng(config.seed)
        self.finished = asyncio.Event()
        self.devices = {cid: self._device(cid, broker, credentials) for cid in ids}
        self.ready: dict[int, set[str]] = {}  # round -> devices that saw their start
        self.release: dict[int, asyncio.Event] = {}
        self.sent = 0

    def _device(self, cid: str, broker: BrokerAddress, credentials: Credentials | None) -> Device:
        k = self.config.model.num_classes
        classes = sorted(int(c) for c in self.rng.choice(k, size=min(k, 3), replace=False))
        run = self.config.run_id
        info = ClientInfo(cid, "load", tuple(classes), 50, (1,))
        bus = Bus(
            broker,
            identifier=f"mqttfl-{run}-load-{cid}",
            subscriptions=[self.topics.any_start, self.topics.any_down_all, self.topics.state],
            will=(self.topics.status(cid), Offline(cid, "connection lost").encode(run)),
            birth=lambda: [(self.topics.status(cid), Online(info).encode(run), True)],
            credentials=credentials,
            keepalive_s=self.config.broker.keepalive_s,
        )
        return Device(cid, bus, classes)

    async def _on_start(self, device: Device, start: RoundStart, received: float) -> None:
        t = start.round
        if t in device.uploaded or device.client_id not in start.selected:
            return
        if time.monotonic() > received + start.timeout_s:
            return
        device.uploaded.add(t)
        ack = Ack(t, device.client_id, start.announcement).encode(self.config.run_id)
        await device.bus.publish(self.topics.ack(t, device.client_id), ack)
        selected = set(start.selected) & set(self.devices)
        waiting = self.ready.setdefault(t, set())
        waiting.add(device.client_id)
        release = self.release.setdefault(t, asyncio.Event())
        if waiting >= selected:
            release.set()
        try:
            await asyncio.wait_for(release.wait(), timeout=BARRIER_S)
        except TimeoutError:
            release.set()  # somebody missed the start; go without them
        payload = prototype_upload(
            self.config.run_id,
            t,
            device.client_id,
            device.classes,
            self.config.model.embed_dim,
            self.rng,
        )
        await device.bus.publish(self.topics.up(t, device.client_id), payload)
        self.sent += 1

    async def _on_broadcast(self, device: Device, t: int) -> None:
        if t in device.reported:
            return
        device.reported.add(t)
        body = {
            "accuracy": 0.0,
            "f1": 0.0,
            "mae": 0.0,
            "num_test": 0,
            "selected": t in device.uploaded,
            "load_client": True,
        }
        metrics = Metrics(t, device.client_id, body).encode(self.config.run_id)
        await device.bus.publish(self.topics.metrics(t, device.client_id), metrics)

    async def _work(self, device: Device) -> None:
        while True:
            incoming = await device.bus.incoming.get()
            if not incoming.payload:
                continue
            run = self.config.run_id
            try:
                where = self.topics.parse(incoming.topic)
                start = None
                if where.kind == "state":
                    status = read_run_status(incoming.payload, run_id=run)
                    if status.phase == "finished":
                        self.finished.set()
                    start = status.start
                elif where.kind == "start" and where.round is not None:
                    start = read_start(incoming.payload, run_id=run, round=where.round)
                elif where.kind == "down" and where.round is not None and where.client:
                    read_downlink(
                        incoming.payload, run_id=run, round=where.round, client=where.client
                    )
                    await self._on_broadcast(device, where.round)
            except WireError as exc:
                self.log.warning("message.rejected", topic=incoming.topic, reason=exc.reason)
                continue
            if start is not None:
                task = self._on_start(device, start, incoming.received)
                asyncio.get_running_loop().create_task(task)

    async def run(self) -> int:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(d.bus.run()) for d in self.devices.values()]
            tasks += [group.create_task(self._work(d)) for d in self.devices.values()]
            self.log.info("load.started", devices=len(self.devices))
            await self.finished.wait()
            for device in self.devices.values():
                await device.bus.publish(
                    self.topics.status(device.client_id),
                    Offline(device.client_id, "exit").encode(self.config.run_id),
                    retain=True,
                    timeout=5,
                )
            self.log.info("load.finished", uploads_sent=self.sent)
            for task in tasks:
                task.cancel()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqttfl.runtime.loadclient", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--broker", required=True)
    parser.add_argument("--clients", type=int, required=True, help="how many simulated devices")
    parser.add_argument(
        "--prefix", default="load", help="client ids are <prefix>000, <prefix>001, ..."
    )
    parser.add_argument("--config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log", help="JSON-lines log file")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        configure_logging(None if args.log is None else Path(args.log), level="info")
        b = config.broker
        fleet = LoadFleet(
            config,
            BrokerAddress.parse(args.broker),
            load_ids(args.clients, args.prefix),
            credentials=Credentials(b.username, b.password, b.tls_ca, b.tls_cert, b.tls_key),
        )
        return asyncio.run(fleet.run())
    except MqttflError as exc:
        sys.stderr.write(f"loadclient: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
