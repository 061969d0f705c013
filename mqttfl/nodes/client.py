"""The client runner: one OS process per device (or many runners in one fleet process,
:mod:`mqttfl.nodes.fleet`, each still its own device to the broker).

It announces itself (retained ``online`` status with its model, classes and sample
count; a last will of ``offline``), acknowledges a round's start at once when selected,
trains (off the event loop, so the MQTT keep-alive goes on during long epochs), uploads
only what its method permits, takes in each round's downlinks, evaluates its
personalized model on its local test split and publishes the metrics. Its state lives
on disk, so a restarted client resumes.

Every message is decoded and validated before it is acted on (:mod:`mqttfl.wire.control`
and the method's own downlink check); a bad one is logged and dropped, and the client
goes on waiting for the real one. Deadlines are relative (``timeout_s``) and measured on
the local monotonic clock, so a device with a wrong wall clock still trains.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
import torch

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.bus.transport import BrokerAddress, Bus, Credentials, Incoming
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.errors import WireError
from mqttfl.logs import get_logger
from mqttfl.nodes.client_state import Progress, StateFile
from mqttfl.nodes.device import build_client_side, round_rng
from mqttfl.training.metrics import classification_report
from mqttfl.wire import Message, Topics, check_id, encode
from mqttfl.wire.control import (
    Ack,
    Downlink,
    Metrics,
    Offline,
    Online,
    RoundStart,
    RunStatus,
    read_downlink,
    read_run_status,
    read_start,
    read_status,
)
from mqttfl.wire.ids import BROADCAST

T = TypeVar("T")

HEAL_INTERVAL_S = 1.0  # at most one re-announcement per second after a forged 'offline'


@dataclass
class PendingDownlink:
    broadcast: Downlink | None = None
    personal: Downlink | None = None
    size: int = 0


@dataclass(frozen=True)
class SentUpload:
    round: int
    announcement: int  # of the start it answered
    payload: bytes
    sent: float  # monotonic


@dataclass(frozen=True)
class Received:
    """A validated message and when it arrived (monotonic)."""

    message: RoundStart | RunStatus | Downlink
    topic_client: str | None
    size: int
    received: float


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
        executor: Executor | None = None,
    ) -> None:
        """``executor`` runs training and evaluation (a fleet's worker pool, shared by its
        runners); without one they run in asyncio's default thread pool."""
        self.config = config
        self.executor = executor
        self.client_id = check_id(client_id)
        self.topics = Topics(config.run_id)
        self.shard = shard
        torch.set_num_threads(config.train.torch_threads)
        algorithm = get_algorithm(config.method)
        self.ctx = make_context(config)
        self.method = build_client_side(config, algorithm, self.ctx, client_id, shard)
        self.model, self.info = self.method.model, self.method.info
        self.schema = algorithm.upload_schema(self.ctx, self.info)
        self.progress = Progress()
        self.state_file = StateFile(state_dir / f"client-{client_id}.pt")
        self.pending: dict[int, PendingDownlink] = {}
        # The newest round known closed (its closed status, or a start of the next one), in
        # the order the worker acts: a downlink is applied only once its round closed, so
        # one sent early (forged, for a round still open or not yet announced) never is.
        self.closed_round = 0
        self.training_round = 0
        self.refused_round = 0  # trained, but its upload failed the schema: not retrained
        self.last_upload: SentUpload | None = None
        self.last_loss = 0.0
        self.finish_seen = False
        self.finished = asyncio.Event()
        self.work: asyncio.Queue[Received] = asyncio.Queue()
        self._acked: set[tuple[int, int]] = set()
        self._healed = -HEAL_INTERVAL_S
        self.log = get_logger(run_id=config.run_id, client_id=client_id)
        resumed = self.state_file.load(self.model, self.method, self.progress)
        if resumed:
            self.log.info(
                "client.resumed",
                trained_round=self.progress.trained_round,
                applied_round=self.progress.applied_round,
            )
        online = Online(self.info).encode(config.run_id)
        self.bus = Bus(
            broker,
            identifier=f"mqttfl-{config.run_id}-client-{client_id}",
            subscriptions=[
                self.topics.any_start,
                self.topics.any_down_all,
                self.topics.any_down_for(client_id),
                self.topics.state,
                self.topics.status(client_id),  # to answer a forged 'offline' about us
            ],
            will=(
                self.topics.status(client_id),
                Offline(client_id, "connection lost").encode(config.run_id),
            ),
            birth=lambda: [(self.topics.status(client_id), online, True)],
            credentials=credentials,
            keepalive_s=config.broker.keepalive_s,
            connect_timeout_s=config.broker.connect_timeout_s,
            max_message_bytes=config.broker.max_message_bytes,
        )

    # --- reading: decode, validate, acknowledge -----------------------------------------------
    def _read(self, incoming: Incoming) -> Received | None:
        """Validate one message; raise WireError for anything hostile."""
        if incoming.error is not None:  # chunks that could not be put together
            raise incoming.error
        where = self.topics.parse(incoming.topic)
        run, size = self.config.run_id, len(incoming.payload)
        message: RoundStart | RunStatus | Downlink
        if where.kind == "status":
            if where.client == self.client_id and incoming.payload:
                status = read_status(incoming.payload, run_id=run, client=self.client_id)
                if isinstance(status, Offline):
                    self._heal(status)
            return None
        if where.kind == "start" and where.round is not None:
            message = read_start(incoming.payload, run_id=run, round=where.round)
        elif where.kind == "state":
            message = read_run_status(incoming.payload, run_id=run)
        elif where.kind == "down" and where.round is not None and where.client is not None:
            if where.client not in (BROADCAST, self.client_id):
                raise WireError(
                    "topic", f"a downlink for {where.client!r} reached {self.client_id!r}"
                )
            message = read_downlink(
                incoming.payload, run_id=run, round=where.round, client=where.client
            )
        else:
            raise WireError("topic", f"a client does not take {where.kind} messages")
        if message.round > self.config.rounds:
            raise WireError(
                "range", f"round {message.round} is beyond the run's {self.config.rounds}"
            )
        if (
            isinstance(message, RunStatus)
            and message.phase == "finished"
            and message.round < self.config.rounds
        ):
            raise WireError(
                "range", f"'finished' after round {message.round} of {self.config.rounds}"
            )
        if isinstance(message, Downlink):
            self._check_downlink(message, personal=where.client != BROADCAST)
        return Received(message, where.client, size, incoming.received)

    def _check_downlink(self, downlink: Downlink, *, personal: bool) -> None:
        try:
            if personal:
                self.method.check_downlink({}, dict(downlink.body))
            else:
                self.method.check_downlink(dict(downlink.body), None)
        except WireError:
            raise
        except Exception as exc:  # the method's check failed on the input: the input is bad
            raise WireError("downlink", f"{type(exc).__name__}: {exc}"[:300]) from None

    def _heal(self, forged: Offline) -> None:
        """Someone says we are offline (a retained copy of our own old will, or a forgery):
        we are not, so say so again."""
        now = time.monotonic()
        if self.finished.is_set() or now - self._healed < HEAL_INTERVAL_S:
            return
        self._healed = now
        self.log.warning("status.corrected", reason=forged.reason)
        online = Online(self.info).encode(self.config.run_id)
        self._spawn(
            self.bus.publish(self.topics.status(self.client_id), online, retain=True, timeout=30)
        )

    async def _off_loop(self, func: Callable[..., T], /, *args: Any) -> T:
        """Run ``func`` off the event loop, so the MQTT keep-alive goes on meanwhile."""
        if self.executor is None:
            return await asyncio.to_thread(func, *args)
        call = functools.partial(contextvars.copy_context().run, func, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("publish.failed", error=str(task.exception()))

    def _acknowledge(self, start: RoundStart) -> None:
        """Tell the coordinator at once that we are alive and will train (before any
        queued evaluation or training delays us)."""
        key = (start.round, start.announcement)
        if self.client_id not in start.selected or key in self._acked:
            return
        self._acked.add(key)
        ack = Ack(start.round, self.client_id, start.announcement).encode(self.config.run_id)
        self._spawn(self.bus.publish(self.topics.ack(start.round, self.client_id), ack, timeout=30))

    async def _reader(self) -> None:
        while True:
            incoming = await self.bus.incoming.get()
            if not incoming.payload and incoming.error is None:
                continue  # a cleared retained message
            try:
                received = self._read(incoming)
            except WireError as exc:
                self.log.warning(
                    "message.rejected",
                    topic=incoming.topic[:200],
                    reason=exc.reason,
                    detail=exc.detail,
                )
                continue
            if received is None:
                continue
            message = received.message
            if isinstance(message, RunStatus) and message.start is not None:
                message = message.start
            if isinstance(message, RoundStart):
                self._acknowledge(message)
            self.work.put_nowait(received)

    # --- acting --------------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            received = await self.work.get()
            try:
                await self._act(received)
            except Exception as exc:  # one message never ends the client
                self.log.warning(
                    "message.failed",
                    kind=type(received.message).__name__,
                    round=received.message.round,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )

    async def _act(self, received: Received) -> None:
        message = received.message
        if isinstance(message, Downlink):
            await self._on_downlink(message, received)
            return
        start = message.start if isinstance(message, RunStatus) else message
        if start is not None:  # round t open: round t-1 closed
            self.closed_round = max(self.closed_round, start.round - 1)
        elif isinstance(message, RunStatus) and message.phase == "closed":
            self.closed_round = max(self.closed_round, message.round)
        elif isinstance(message, RunStatus) and message.phase == "finished":
            self.finish_seen = True
            self.log.info("run.finishing", round=message.round)
        await self._apply_ready()  # the last round's downlinks before the next round's training
        if start is not None:
            await self._on_start(start, received.received)

    async def _on_start(self, start: RoundStart, received: float) -> None:
        if self.client_id not in start.selected:
            return
        if self._should_resend(start, received):
            await self._resend(start, received)
        await self._train_round(start, received)

    def _should_resend(self, start: RoundStart, received: float) -> bool:
        """Round t announced anew (a restarted coordinator, a retry) without our upload,
        which we had sent before this start arrived (so the two did not cross on the wire)."""
        if start.round != self.progress.trained_round or self.client_id in start.uploaded:
            return False
        last = self.last_upload
        if last is None or last.round != start.round:
            return True  # sent in an earlier life of this process
        return last.announcement != start.announcement and last.sent < received

    async def _train_round(self, start: RoundStart, received: float) -> None:
        t = start.round
        if t <= self.progress.trained_round or t in (self.training_round, self.refused_round):
            return
        log = self.log.bind(round=t)
        if time.monotonic() > received + start.timeout_s:
            log.warning("round.skipped", reason="deadline already passed")
            return
        began = time.monotonic()
        self.training_round = t
        before = StateFile.snapshot(self.model, self.method, self.progress)
        try:
            log.info("training.started", selected=len(start.selected))
            rng = round_rng(self.config.seed, self.info, t)
            params = dict(start.params)
            loss = await self._off_loop(self.method.train, t, params, rng)
            body = await self._off_loop(self.method.make_upload, t)
        finally:
            self.training_round = 0
        try:  # refuse to publish anything the method does not permit
            self.schema.validate(body)
        except WireError as exc:
            # Diverged training (weights past the method's bound): this round's update is
            # dropped, so the next round starts from the model, optimizer and method state
            # it had, not from the diverged ones; the round goes on without this client.
            StateFile.restore(before, self.model, self.method, self.progress)
            self.refused_round = t
            log.warning(
                "upload.refused",
                reason=exc.reason,
                detail=exc.detail,
                train_loss=round(float(loss), 4),
            )
            return
        payload = encode(Message("upload", self.config.run_id, t, self.client_id, body))
        await self.bus.publish(self.topics.up(t, self.client_id), payload)
        self.last_upload = SentUpload(t, start.announcement, payload, time.monotonic())
        self.progress.trained_round = t
        self.progress.bytes_up[t] = len(payload)
        self.last_loss = float(loss)
        await self.state_file.save(self.model, self.method, self.progress)
        log.info(
            "upload.sent",
            bytes=len(payload),
            train_loss=round(loss, 4),
            seconds=round(time.monotonic() - began, 3),
        )

    async def _resend(self, start: RoundStart, received: float) -> None:
        """Round t was announced again without our upload (the coordinator restarted, or
        the upload was lost while the broker restarted): send the same upload again."""
        t = start.round
        if time.monotonic() > received + start.timeout_s:
            return
        last = self.last_upload
        payload = last.payload if last is not None and last.round == t else None
        if payload is None:  # restarted since: the model on disk is the one trained for t
            body = await self._off_loop(self.method.make_upload, t)
            self.schema.validate(body)
            payload = encode(Message("upload", self.config.run_id, t, self.client_id, body))
        await self.bus.publish(self.topics.up(t, self.client_id), payload)
        self.last_upload = SentUpload(t, start.announcement, payload, time.monotonic())
        self.log.info("upload.resent", round=t, bytes=len(payload), attempt=start.attempt)

    async def _on_downlink(self, downlink: Downlink, received: Received) -> None:
        t = downlink.round
        if t <= self.progress.applied_round:
            return
        pending = self.pending.setdefault(t, PendingDownlink())
        pending.size += received.size
        if received.topic_client == BROADCAST:
            pending.broadcast = downlink
        else:
            pending.personal = downlink
        await self._apply_ready()

    async def _apply_ready(self) -> None:
        for t in sorted(self.pending):
            pending = self.pending[t]
            last = self.finish_seen and t == self.config.rounds
            if pending.broadcast is None or (t > self.closed_round and not last):
                continue  # held until its round is known closed
            personal_for = pending.broadcast.personal_for or ()
            wants_personal = self.client_id in personal_for
            newer = any(u > t and p.broadcast is not None for u, p in self.pending.items())
            if wants_personal and pending.personal is None and not (newer or last):
                return  # wait for the personalized downlink
            if wants_personal and pending.personal is None:
                self.log.warning("downlink.personal_missing", round=t)
            del self.pending[t]
            await self._apply(t, pending)
        self._maybe_finish()

    async def _apply(self, t: int, pending: PendingDownlink) -> None:
        assert pending.broadcast is not None
        personal = dict(pending.personal.body) if pending.personal is not None else None
        self.method.receive(t, dict(pending.broadcast.body), personal)
        predicted = await self._off_loop(self.method.predict, self.shard.x_test)
        report = classification_report(self.shard.y_test, predicted)
        extra = await self._off_loop(
            self.method.extra_metrics, self.shard.x_test, self.shard.y_test
        )
        self.progress.applied_round = t
        await self.state_file.save(self.model, self.method, self.progress)
        values = {
            **extra,
            **report,
            "num_test": len(self.shard.y_test),
            "bytes_up": self.progress.bytes_up.pop(t, 0),
            "bytes_down": pending.size,
            "selected": t == self.progress.trained_round,
            "train_loss": self.last_loss,
        }
        metrics = Metrics(t, self.client_id, values).encode(self.config.run_id)
        await self.bus.publish(self.topics.metrics(t, self.client_id), metrics)
        self.log.info("round.evaluated", round=t, **{k: round(v, 4) for k, v in report.items()})

    def _maybe_finish(self) -> None:
        if self.finish_seen and self.progress.applied_round >= self.config.rounds:
            self.finished.set()

    # --- whole life ----------------------------------------------------------------------
    async def _last_words(self, loop: Coroutine[Any, Any, None]) -> None:
        """If a loop of this client dies, say ``offline`` while the connection is still up
        (a clean disconnect fires no last will), then let the failure end the client."""
        try:
            await loop
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log.error("client.failed", error=error[:300])
            offline = Offline(self.client_id, f"failed: {error}"[:200]).encode(self.config.run_id)
            await self.bus.publish(
                self.topics.status(self.client_id), offline, retain=True, timeout=5
            )
            raise

    async def run(self) -> int:
        structlog.contextvars.bind_contextvars(run_id=self.config.run_id, client_id=self.client_id)
        self.log.info(
            "client.started",
            arch=self.info.arch,
            classes=list(self.info.classes),
            samples=self.info.num_samples,
        )
        offline = Offline(self.client_id, "exit").encode(self.config.run_id)
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self.bus.run()),
                group.create_task(self._last_words(self._reader())),
                group.create_task(self._last_words(self._worker())),
            ]
            try:
                await self.bus.wait_connected(timeout=self.config.broker.connect_timeout_s)
                await self.finished.wait()
                await self.state_file.written()
                self.log.info("run.finished")
            finally:
                # Stopping for any reason: say so first, so the coordinator knows at once.
                try:
                    if self.bus.connected.is_set():
                        await self.bus.publish(
                            self.topics.status(self.client_id), offline, retain=True, timeout=5
                        )
                finally:
                    for task in tasks:
                        task.cancel()
        return 0
