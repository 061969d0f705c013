"""A LOAD client without torch models: many simulated devices in one process, for fan-in drills.

This is not a federated-learning client: it builds no model, trains nothing and imports
no torch. Each simulated device has its own MQTT session (a
:class:`~mqttfl.bus.transport.Bus`: retained ``online`` status, last will) with
every subscription a real client has (round starts, the run state, the broadcast, its
personal downlink, its own status), so it pays what a real device pays on the downlink.
It acknowledges every start that selects it and uploads a valid payload: random float32
prototypes for its classes (see :func:`mqttfl.algorithms.fedapa.prototype_schema`), or
with ``--upload weights`` a weight vector of the config's model (FedAvg and the other
weight-sharing methods; its length from :mod:`mqttfl.models.sizes`, so still no torch).
Above ``broker.max_message_bytes`` an upload goes in chunks, and a device asked to send
it again (:class:`~mqttfl.wire.resend.Resend`) does so.
All selected devices upload at the same instant, behind a barrier. Every downlink is
decoded and validated; the device notes when it holds its complete downlink (the
broadcast, plus its personal body when the broadcast lists it). It answers each round's
broadcast with placeholder metrics (marked ``load_client``) so the coordinator's
accounting and summary stay complete. ``--timings FILE`` writes the per-round records
(times on the system-wide monotonic clock, comparable across processes).

Run: ``python -m mqttfl.testing.loadclient --broker mqtt://127.0.0.1:1883 --clients 100
--config configs/fedapa-csi.toml [--set KEY=VALUE ...] [--classes-each 21] [--timings out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus, Incoming
from mqttfl.config import RunConfig, load_config
from mqttfl.errors import MqttflError, WireError
from mqttfl.logs import configure_logging, get_logger
from mqttfl.models.sizes import weight_count
from mqttfl.wire import Message, Topics, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    RoundStart,
    read_run_status,
    read_start,
)
from mqttfl.wire.resend import Resend, read_downlink_or_resend
from mqttfl.wire.schemas import ClientInfo
from mqttfl.wire.topics import DownTopic, StartTopic, StateTopic

BARRIER_S = 2.0  # how long the first selected device waits for the others before all upload


def load_ids(count: int, prefix: str = "load") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(count)]


UploadKind = Literal["prototypes", "weights"]
LOAD_SAMPLES = 50  # what each simulated device announces
LOAD_SIDE = 8  # and the side of its samples


def weights_upload(
    run: str, t: int, client_id: str, length: int, rng: np.random.Generator
) -> bytes:
    body = {
        "weights": (0.01 * rng.standard_normal(length)).astype(np.float32),
        "num_samples": LOAD_SAMPLES,
    }
    return encode(Message("upload", run, t, client_id, body))


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
    expects_personal: dict[int, bool] = field(default_factory=dict)  # round -> listed
    personal: set[int] = field(default_factory=set)
    complete: set[int] = field(default_factory=set)
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)  # one upload at a time
    payloads: dict[int, tuple[bytes, int | None]] = field(default_factory=dict)  # newest send
    resent: int = 0


@dataclass
class RoundRecord:
    """What the devices of one round did and received (monotonic-clock times)."""

    uploads: int = 0
    upload_bytes: int = 0
    t_publish: float = 0.0  # the barrier's release: the first upload is handed to MQTT
    t_acked: float = 0.0  # the last upload's PUBACK
    down_messages: int = 0
    down_bytes: int = 0
    personal_bytes_max: int = 0
    complete: dict[str, float] = field(default_factory=dict)  # device -> when it held it all

    def to_dict(self, t: int) -> dict[str, object]:
        done = sorted(self.complete.values())
        return {
            "round": t,
            "uploads": self.uploads,
            "bytes_each": self.upload_bytes,
            "t_publish": self.t_publish,
            "t_acked": self.t_acked,
            "down_messages": self.down_messages,
            "down_bytes": self.down_bytes,
            "personal_bytes_max": self.personal_bytes_max,
            "complete_downlinks": len(done),
            "t_last_complete": done[-1] if done else None,
        }


class LoadFleet:
    """``count`` simulated devices sharing one event loop and one upload barrier."""

    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        ids: list[str],
        *,
        credentials: Credentials | None = None,
        classes_each: int = 3,
        upload: UploadKind = "prototypes",
    ) -> None:
        self.config = config
        self.classes_each = classes_each
        self.upload = upload
        model = config.model
        match upload:
            case "weights":  # a weight-sharing upload is the config's model
                self.arch = model.name
                self.weights_length = weight_count(
                    model.name,
                    num_classes=model.num_classes,
                    embed_dim=model.embed_dim,
                    input_dim=LOAD_SIDE,
                )
            case "prototypes":  # prototypes need no model at all
                self.arch, self.weights_length = "load", 0
        # A sample shape the model takes (the coordinator checks it): windows, or vectors.
        self.sample_shape = (LOAD_SIDE,) if self.arch in ("load", "mlp") else (LOAD_SIDE,) * 2
        self.topics = Topics(config.run_id)
        self.log = get_logger(run_id=config.run_id, client_id="loadclient")
        self.rng = np.random.default_rng(config.seed)
        self.finished = asyncio.Event()
        self.devices = {cid: self._device(cid, broker, credentials) for cid in ids}
        self.ready: dict[int, set[str]] = {}  # round -> devices that saw their start
        self.release: dict[int, asyncio.Event] = {}
        self.sent = 0
        self.records: dict[int, RoundRecord] = {}

    def _device(self, cid: str, broker: BrokerAddress, credentials: Credentials | None) -> Device:
        k = self.config.model.num_classes
        size = min(k, self.classes_each)
        classes = sorted(int(c) for c in self.rng.choice(k, size=size, replace=False))
        run = self.config.run_id
        info = ClientInfo(cid, self.arch, tuple(classes), LOAD_SAMPLES, self.sample_shape)
        bus = Bus(
            broker,
            identifier=f"mqttfl-{run}-load-{cid}",
            subscriptions=[  # the same as a real client's (mqttfl.nodes.client)
                self.topics.any_start,
                self.topics.any_down_all,
                self.topics.any_down_for(cid),
                self.topics.state,
                self.topics.status(cid),
            ],
            will=(self.topics.status(cid), Offline(cid, "connection lost").encode(run)),
            birth=lambda: [(self.topics.status(cid), Online(info).encode(run), True)],
            credentials=credentials,
            keepalive_s=self.config.broker.keepalive_s,
            max_message_bytes=self.config.broker.max_message_bytes,
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
        record = self.records.setdefault(t, RoundRecord())
        if waiting >= selected:
            release.set()
        try:
            await asyncio.wait_for(release.wait(), timeout=BARRIER_S)
        except TimeoutError:
            release.set()  # somebody missed the start; go without them
        if not record.t_publish:
            record.t_publish = time.monotonic()
        run = self.config.run_id
        match self.upload:
            case "weights":
                payload = weights_upload(run, t, device.client_id, self.weights_length, self.rng)
            case "prototypes":
                embed_dim = self.config.model.embed_dim
                payload = prototype_upload(
                    run, t, device.client_id, device.classes, embed_dim, self.rng
                )
        async with device.sending:
            message = await device.bus.publish(self.topics.up(t, device.client_id), payload)
            device.payloads = {t: (payload, message)}  # only the newest is ever asked again
        self.sent += 1
        record.uploads += 1
        record.upload_bytes = len(payload)
        record.t_acked = max(record.t_acked, time.monotonic())

    async def _resend(self, device: Device, request: Resend) -> None:
        t = request.round
        async with device.sending:
            payload, message = device.payloads.get(t, (b"", None))
            if message != request.message:
                return  # not our newest send of that round
            message = await device.bus.publish(self.topics.up(t, device.client_id), payload)
            device.payloads = {t: (payload, message)}
        device.resent += 1
        self.log.info(
            "upload.resent", client_id=device.client_id, round=request.round, reason=request.reason
        )

    def _on_downlink(self, device: Device, t: int, personal_for: tuple[str, ...] | None) -> None:
        """Note when ``device`` holds round ``t``'s complete downlink."""
        if personal_for is None:
            device.personal.add(t)
        else:
            device.expects_personal[t] = device.client_id in personal_for
        listed = device.expects_personal.get(t)
        if listed is None or (listed and t not in device.personal) or t in device.complete:
            return
        device.complete.add(t)
        self.records.setdefault(t, RoundRecord()).complete[device.client_id] = time.monotonic()

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
            start = None
            try:
                match self.topics.parse(incoming.topic):
                    case StateTopic():
                        status = read_run_status(incoming.payload, run_id=run)
                        if status.phase == "finished":
                            self.finished.set()
                        start = status.start
                    case StartTopic(t):
                        start = read_start(incoming.payload, run_id=run, round=t)
                    case DownTopic(t, client):
                        await self._on_down(device, t, client, incoming)
            except WireError as exc:
                self.log.warning("message.rejected", topic=incoming.topic, reason=exc.reason)
                continue
            if start is not None:
                task = self._on_start(device, start, incoming.received)
                asyncio.get_running_loop().create_task(task)

    async def _on_down(self, device: Device, t: int, client: str, incoming: Incoming) -> None:
        """A downlink (``client`` is the device or BROADCAST), or a request to resend."""
        downlink = read_downlink_or_resend(
            incoming.payload, run_id=self.config.run_id, round=t, client=client
        )
        if isinstance(downlink, Resend):
            asyncio.get_running_loop().create_task(self._resend(device, downlink))
            return
        record = self.records.setdefault(t, RoundRecord())
        record.down_messages += 1
        record.down_bytes += incoming.wire_bytes
        if downlink.personal_for is None:
            record.personal_bytes_max = max(record.personal_bytes_max, incoming.wire_bytes)
        self._on_downlink(device, t, downlink.personal_for)
        if downlink.personal_for is not None:
            await self._on_broadcast(device, t)

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

    def timings(self) -> dict[str, object]:
        return {
            "clients": len(self.devices),
            "rounds": [self.records[t].to_dict(t) for t in sorted(self.records)],
            "torch_imported": "torch" in sys.modules,
            "resent": sum(d.resent for d in self.devices.values()),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqttfl.testing.loadclient", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--broker", required=True)
    parser.add_argument("--clients", type=int, required=True, help="how many simulated devices")
    parser.add_argument(
        "--prefix", default="load", help="client ids are <prefix>000, <prefix>001, ..."
    )
    parser.add_argument("--config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log", help="JSON-lines log file")
    parser.add_argument(
        "--classes-each", type=int, default=3, help="classes each device holds and uploads"
    )
    parser.add_argument(
        "--upload",
        choices=["prototypes", "weights"],
        default="prototypes",
        help="what each device uploads: FedAPA-style prototypes, or the model's weights",
    )
    parser.add_argument("--timings", help="write the per-round records to this JSON file")
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
            classes_each=args.classes_each,
            upload=args.upload,
        )
        code = asyncio.run(fleet.run())
        if args.timings:
            Path(args.timings).write_text(json.dumps(fleet.timings()))
        return code
    except MqttflError as exc:
        sys.stderr.write(f"loadclient: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
