"""The client runner: one OS process per device.

It announces itself (retained ``online`` status with its model, classes and sample
count; a last will of ``offline``), trains when selected (off the event loop, so the
MQTT keep-alive goes on during long epochs), uploads only what its method permits,
takes in each round's downlinks, evaluates its personalized model on its local test
split and publishes the metrics. Its state lives on disk, so a restarted client resumes.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.algorithms.base import ClientInfo
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.errors import WireError
from mqttfl.logs import get_logger
from mqttfl.models import build_model
from mqttfl.runtime import messages
from mqttfl.runtime.transport import BrokerAddress, Bus, Credentials, Incoming
from mqttfl.training.metrics import classification_report
from mqttfl.wire import Message, Topics, check_id, decode, encode


@dataclass
class PendingDownlink:
    broadcast: dict[str, Any] | None = None
    personal: dict[str, Any] | None = None
    size: int = 0


@dataclass
class Progress:
    trained_round: int = 0
    applied_round: int = 0
    bytes_up: dict[int, int] = field(default_factory=dict)


class ClientRunner:
    def __init__(
        self,
        config: RunConfig,
        client_id: str,
        broker: BrokerAddress,
        shard: Shard,
        *,
        state_dir: Path,
        credentials: Credentials | None = None,
    ) -> None:
        self.config = config
        self.client_id = check_id(client_id)
        self.topics = Topics(config.run_id)
        self.shard = shard
        torch.set_num_threads(config.train.torch_threads)
        algorithm = get_algorithm(config.method)
        self.ctx = make_context(config)
        arch = config.model.arch_for(int(client_id) if client_id.isdigit() else 0)
        torch.manual_seed(config.seed)  # identical initial weights per architecture
        sample_shape = tuple(int(n) for n in shard.x_train.shape[1:])
        self.model = build_model(
            arch,
            num_classes=config.model.num_classes,
            embed_dim=config.model.embed_dim,
            input_dim=sample_shape[0] if len(sample_shape) == 1 else None,
        )
        self.info = ClientInfo(
            client_id,
            arch,
            tuple(int(c) for c in np.unique(shard.y_train)),
            int(len(shard.y_train)),
            sample_shape,
        )
        self.method = algorithm.client(self.ctx, self.info, self.model, shard, config.train)
        self.schema = algorithm.upload_schema(self.ctx, self.info)
        self.state_path = state_dir / f"client-{client_id}.pt"
        self.progress = Progress()
        self.pending: dict[int, PendingDownlink] = {}
        # (round, deadline of the announcement it answered, payload, monotonic time sent)
        self.last_upload: tuple[int, float, bytes, float] | None = None
        self.finished = asyncio.Event()
        self._writing: asyncio.Task[None] | None = None  # the state file being written
        self.log = get_logger(run_id=config.run_id, client_id=client_id)
        self._load_state()
        self.bus = Bus(
            broker,
            identifier=f"mqttfl-{config.run_id}-client-{client_id}",
            subscriptions=[
                self.topics.any_start,
                self.topics.any_down_all,
                self.topics.any_down_for(client_id),
                self.topics.state,
            ],
            will=(
                self.topics.status(client_id),
                messages.status_offline(config.run_id, client_id, "connection lost"),
            ),
            birth=lambda: [
                (
                    self.topics.status(client_id),
                    messages.status_online(config.run_id, self.info),
                    True,
                )
            ],
            credentials=credentials,
            keepalive_s=config.broker.keepalive_s,
        )

    # --- persistence ----------------------------------------------------------------
    def _load_state(self) -> None:
        if not self.state_path.exists():
            return
        state = torch.load(self.state_path, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.method.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict({k: v.numpy() for k, v in state["method"].items()})
        self.progress.trained_round = int(state["trained_round"])
        self.progress.applied_round = int(state["applied_round"])
        self.log.info(
            "client.resumed",
            trained_round=self.progress.trained_round,
            applied_round=self.progress.applied_round,
        )

    def _state_snapshot(self) -> dict[str, Any]:
        """A copy of everything a restart needs, taken between training steps."""
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.method.optimizer.state_dict()),
            "method": {
                k: torch.from_numpy(np.array(v, copy=True))
                for k, v in self.method.state_dict().items()
            },
            "trained_round": self.progress.trained_round,
            "applied_round": self.progress.applied_round,
        }

    def _write_state(self, snapshot: dict[str, Any]) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        torch.save(snapshot, tmp)
        os.replace(tmp, self.state_path)

    async def _save_state(self) -> None:
        """Snapshot now, write in the background: serializing the model is not on the
        round's critical path. Writes stay in order (each waits for the one before)."""
        snapshot = self._state_snapshot()
        await self._state_written()
        self._writing = asyncio.create_task(asyncio.to_thread(self._write_state, snapshot))

    async def _state_written(self) -> None:
        if self._writing is not None:
            await self._writing
            self._writing = None

    # --- message handling -----------------------------------------------------------
    async def _handle(self, incoming: Incoming) -> None:
        if not incoming.payload:
            return  # a cleared retained message
        where = self.topics.parse(incoming.topic)
        if where.kind in ("start", "state"):
            message = messages.read_control(incoming.payload, where.kind)
            if where.kind == "state" and message.body["status"] == "finished":
                self.log.info("run.finished", round=message.round)
                self.finished.set()
                return
            if "selected" in message.body and self.client_id in message.body["selected"]:
                if where.kind == "start" and self._should_resend(message, incoming.received):
                    await self._resend(message)
                await self._train_round(message)
        elif where.kind == "down" and where.round is not None:
            message = decode(incoming.payload)
            if message.type != "downlink" or where.round <= self.progress.applied_round:
                return
            pending = self.pending.setdefault(where.round, PendingDownlink())
            pending.size += len(incoming.payload)
            if where.client == "all":
                pending.broadcast = message.body
            else:
                pending.personal = message.body
            await self._apply_ready()

    def _should_resend(self, start: Message, received: float) -> bool:
        """Round t announced anew (a restarted coordinator, a retry) without our upload,
        which we had sent before this start arrived (so the two did not cross on the wire)."""
        t = start.round
        held = start.body.get("uploaded", [self.client_id])  # older coordinators do not say
        if t != self.progress.trained_round or self.client_id in held:
            return False
        last = self.last_upload
        if last is None or last[0] != t:
            return True  # sent in an earlier life of this process
        return last[1] != float(start.body["deadline"]) and last[3] < received

    async def _train_round(self, start: Message) -> None:
        t = start.round
        if t <= self.progress.trained_round:
            return
        log = self.log.bind(round=t)
        if time.time() > float(start.body["deadline"]):
            log.warning("round.skipped", reason="deadline already passed")
            return
        began = time.monotonic()
        log.info("training.started", selected=len(start.body["selected"]))
        rng = np.random.default_rng(
            [
                self.config.seed,
                self.info.num_samples,
                t,
                int(self.client_id) if self.client_id.isdigit() else 0,
            ]
        )
        loss = await asyncio.to_thread(self.method.train, t, dict(start.body["params"]), rng)
        body = await asyncio.to_thread(self.method.make_upload, t)
        self.schema.validate(body)  # refuse to publish anything the method does not permit
        payload = encode(Message("upload", self.config.run_id, t, self.client_id, body))
        await self.bus.publish(self.topics.up(t, self.client_id), payload)
        self.last_upload = (t, float(start.body["deadline"]), payload, time.monotonic())
        self.progress.trained_round = t
        self.progress.bytes_up[t] = len(payload)
        self.last_loss = loss
        await self._save_state()
        log.info(
            "upload.sent",
            bytes=len(payload),
            train_loss=round(loss, 4),
            seconds=round(time.monotonic() - began, 3),
        )

    async def _resend(self, start: Message) -> None:
        """Round t was announced again without our upload (the coordinator restarted, or
        the upload was lost while the broker restarted): send the same upload again."""
        t = start.round
        if time.time() > float(start.body["deadline"]):
            return
        payload = self.last_upload[2] if self.last_upload and self.last_upload[0] == t else None
        if payload is None:  # restarted since: the model on disk is the one trained for t
            body = await asyncio.to_thread(self.method.make_upload, t)
            self.schema.validate(body)
            payload = encode(Message("upload", self.config.run_id, t, self.client_id, body))
        await self.bus.publish(self.topics.up(t, self.client_id), payload)
        self.last_upload = (t, float(start.body["deadline"]), payload, time.monotonic())
        self.log.info(
            "upload.resent", round=t, bytes=len(payload), attempt=start.body.get("attempt")
        )

    async def _apply_ready(self) -> None:
        for t in sorted(self.pending):
            pending = self.pending[t]
            if pending.broadcast is None:
                continue
            wants_personal = self.client_id in pending.broadcast.get("_personal", [])
            newer = any(u > t and p.broadcast is not None for u, p in self.pending.items())
            if wants_personal and pending.personal is None and not newer:
                return  # wait for the personalized downlink
            if wants_personal and pending.personal is None:
                self.log.warning("downlink.personal_missing", round=t)
            del self.pending[t]
            await self._apply(t, pending)

    async def _apply(self, t: int, pending: PendingDownlink) -> None:
        broadcast = {k: v for k, v in (pending.broadcast or {}).items() if k != "_personal"}
        self.method.receive(t, broadcast, pending.personal)
        predicted = await asyncio.to_thread(self.method.predict, self.shard.x_test)
        report = classification_report(self.shard.y_test, predicted)
        extra = await asyncio.to_thread(
            self.method.extra_metrics, self.shard.x_test, self.shard.y_test
        )
        self.progress.applied_round = t
        await self._save_state()
        body = {
            **extra,
            **report,
            "num_test": int(len(self.shard.y_test)),
            "bytes_up": self.progress.bytes_up.pop(t, 0),
            "bytes_down": pending.size,
            "selected": t == self.progress.trained_round,
            "train_loss": float(getattr(self, "last_loss", 0.0)),
        }
        await self.bus.publish(
            self.topics.metrics(t, self.client_id),
            encode(Message("metrics", self.config.run_id, t, self.client_id, body)),
        )
        self.log.info("round.evaluated", round=t, **{k: round(v, 4) for k, v in report.items()})

    async def _work(self) -> None:
        while True:
            incoming = await self.bus.incoming.get()
            try:
                await self._handle(incoming)
            except WireError as exc:
                self.log.warning(
                    "message.rejected", topic=incoming.topic, reason=exc.reason, detail=exc.detail
                )

    async def run(self) -> int:
        structlog.contextvars.bind_contextvars(run_id=self.config.run_id, client_id=self.client_id)
        self.log.info(
            "client.started",
            arch=self.info.arch,
            classes=list(self.info.classes),
            samples=self.info.num_samples,
        )
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.bus.run()), group.create_task(self._work())]
            await self.finished.wait()
            await self._state_written()
            try:
                await self.bus.publish(
                    self.topics.status(self.client_id),
                    messages.status_offline(self.config.run_id, self.client_id, "exit"),
                    retain=True,
                    timeout=5,
                )
            finally:
                for task in tasks:
                    task.cancel()
        return 0
