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
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog
import torch

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.refusal import Refused
from mqttfl.bus.transport import Bus, Incoming
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.errors import BrokerError, MqttflError, StateError, WireError
from mqttfl.logs import get_logger
from mqttfl.nodes.client_inbox import PendingDownlink, Received, SentUpload, read_for_client
from mqttfl.nodes.client_privacy import announced, privacy_allows
from mqttfl.nodes.client_state import Owner, Progress, StateFile, state_path
from mqttfl.nodes.device import build_client_side, round_rng
from mqttfl.nodes.run_lease import finished_text
from mqttfl.training.memory import release, resident_mb
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
)
from mqttfl.wire.resend import Resend

T = TypeVar("T")

HEAL_INTERVAL_S = 1.0  # at most one re-announcement per second after a forged 'offline'
# Sends of one round's upload at the coordinator's request (its chunks could not be put
# together); a bound, so that requests cannot make a device send forever.
MAX_RESENDS_PER_ROUND = 20


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
        runners); without one they run in one thread of this runner's own, so that one
        allocator arena holds what torch allocates (a pool of threads would take one
        each, and keep each one's high-water mark)."""
        self.config = config
        self.executor: Executor = executor or ThreadPoolExecutor(1, thread_name_prefix="train")
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
        self.pending: dict[int, PendingDownlink] = {}
        # The newest round known closed (its closed status, or a start of the next one), in
        # the order the worker acts: a downlink is applied only once its round closed, so
        # one sent early (forged, for a round still open or not yet announced) never is.
        self.closed_round = 0
        self.training_round = self.newest_start = 0  # newest: the newest start selecting us
        self.refused_round = 0  # trained, but its upload failed the schema: not retrained
        self.last_upload: SentUpload | None = None
        self._uploading = asyncio.Lock()  # one upload on the wire at a time (chunks interleave)
        self._resends: dict[int, int] = {}  # round -> sends asked for by the coordinator
        self.last_loss = 0.0
        self.finish_seen = False
        self.finished = asyncio.Event()
        self.work: asyncio.Queue[Received] = asyncio.Queue()
        self._acked: set[tuple[int, int]] = set()
        self._healed = -HEAL_INTERVAL_S
        self.log = get_logger(run_id=config.run_id, client_id=client_id)
        self.state_file = StateFile(
            state_path(state_dir, config.run_id, client_id),
            Owner.of(config, self.info),
            log=self.log,
        )
        resumed = self.state_file.load(self.model, self.method, self.progress)
        if resumed:
            self.log.info(
                "client.resumed",
                trained_round=self.progress.trained_round,
                applied_round=self.progress.applied_round,
            )
        online = Online(announced(self.info, self.ctx)).encode(config.run_id)
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
            who=f"client {client_id!r}",
        )
        self.broker = broker
        self.state_seen = False  # the run's state, the first time: a finished run is not ours

    # --- reading: decode, validate, acknowledge -----------------------------------------------
    def _read(self, incoming: Incoming) -> Received | None:
        """Validate one message; raise WireError for anything hostile."""
        read = read_for_client(
            incoming, config=self.config, client_id=self.client_id, method=self.method
        )
        if isinstance(read, Offline):
            self._heal(read)
            return None
        return read

    def _heal(self, forged: Offline) -> None:
        """Someone says we are offline (a retained copy of our own old will, or a forgery):
        we are not, so say so again."""
        now = time.monotonic()
        if self.finished.is_set() or now - self._healed < HEAL_INTERVAL_S:
            return
        self._healed = now
        self.log.warning("status.corrected", reason=forged.reason)
        online = Online(announced(self.info, self.ctx)).encode(self.config.run_id)
        self._spawn(
            self.bus.publish(self.topics.status(self.client_id), online, retain=True, timeout=30)
        )

    async def _off_loop(self, func: Callable[..., T], /, *args: Any) -> T:
        """Run ``func`` off the event loop, so the MQTT keep-alive goes on meanwhile."""
        call = functools.partial(contextvars.copy_context().run, func, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def _spawn(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("publish.failed", error=str(task.exception()))

    def _acknowledge(self, start: RoundStart) -> None:
        """Tell the coordinator at once that we are alive and will train (before any
        queued evaluation or training delays us)."""
        key = (start.round, start.announcement)
        if self.client_id not in start.selected or key in self._acked:
            return
        self.newest_start = max(self.newest_start, start.round)
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
            if isinstance(message, RunStatus):
                self._check_not_finished_before(message)
            if isinstance(message, RunStatus) and message.start is not None:
                message = message.start
            if isinstance(message, RoundStart):
                self._acknowledge(message)
            if isinstance(message, Resend):
                self._spawn(self._resend_asked(message))
                continue
            self.work.put_nowait(received)

    def _check_not_finished_before(self, status: RunStatus) -> None:
        """The first state we see says the run finished without us: its id was used
        before (a silent exit 0 would look like success)."""
        first, self.state_seen = not self.state_seen, True
        if first and status.phase == "finished" and self.progress.applied_round < status.round:
            raise StateError(finished_text(self.config.run_id, status, self.broker))

    # --- acting --------------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            received = await self.work.get()
            try:
                await self._act(received)
            except Refused:
                raise  # the broker refuses our uploads: nothing we report would count
            except Exception as exc:  # one message never ends the client
                self.log.warning(
                    "message.failed",
                    kind=type(received.message).__name__,
                    round=received.message.round,
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )

    async def _act(self, received: Received) -> None:
        message = received.message
        assert not isinstance(message, Resend)  # handled by the reader
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
        if self.config.federation.mode == "buffered" and t < self.newest_start:
            return  # buffered: train on the newest version we hold (engine/buffered.py)
        log = self.log.bind(round=t)
        if time.monotonic() > received + start.timeout_s:
            log.warning("round.skipped", reason="deadline already passed")
            return
        if not await privacy_allows(self, t):  # its budget is spent: it leaves the run
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
            release()  # the round's activations and batches, back to the OS
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
            # Tell the coordinator, so that the round does not wait for us to its deadline.
            notice = Ack(t, self.client_id, start.announcement, exc.reason[:64] or "refused")
            topic = self.topics.ack(t, self.client_id)
            await self.bus.publish(topic, notice.encode(self.config.run_id), timeout=30)
            return
        payload = encode(Message("upload", self.config.run_id, t, self.client_id, body))
        async with self._uploading:
            sent = await self.bus.publish(self.topics.up(t, self.client_id), payload)
            self.last_upload = SentUpload(t, start.announcement, payload, time.monotonic(), sent)
        self.progress.trained_round = t
        self.progress.bytes_up[t] = len(payload)
        self.last_loss = float(loss)
        await self.state_file.save(self.model, self.method, self.progress)
        rss, peak = resident_mb()
        log.info(
            "upload.sent",
            bytes=len(payload),
            train_loss=round(loss, 4),
            seconds=round(time.monotonic() - began, 3),
            rss_mb=rss,
            peak_rss_mb=peak,
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
        async with self._uploading:
            sent = await self.bus.publish(self.topics.up(t, self.client_id), payload)
            self.last_upload = SentUpload(t, start.announcement, payload, time.monotonic(), sent)
        self.log.info("upload.resent", round=t, bytes=len(payload), attempt=start.attempt)

    async def _resend_asked(self, resend: Resend) -> None:
        """The coordinator could not put our newest upload of round t together: send it
        again (after any send of ours still in progress), while round t is open. A request
        about an older send (or chunks that were never ours) is answered by the newer one."""
        t = resend.round
        async with self._uploading:
            last = self.last_upload
            if last is None or last.round != t or t <= self.closed_round:
                return  # nothing of ours for that round, or it is over
            if last.message != resend.message:
                return
            sent = self._resends.get(t, 0)
            if sent >= MAX_RESENDS_PER_ROUND:
                self.log.warning("upload.resend_refused", round=t, reason=resend.reason)
                return
            self._resends[t] = sent + 1
            message = await self.bus.publish(self.topics.up(t, self.client_id), last.payload)
            self.last_upload = SentUpload(
                t, last.announcement, last.payload, time.monotonic(), message
            )
        self.log.info(
            "upload.resent", round=t, bytes=len(last.payload), reason=resend.reason, asked=sent + 1
        )

    async def _on_downlink(self, downlink: Downlink, received: Received) -> None:
        t = downlink.round
        if t <= self.progress.applied_round:
            return
        pending = self.pending.setdefault(t, PendingDownlink())
        pending.size += received.size
        if received.broadcast:
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
        release()
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
        rss, peak = resident_mb()
        self.log.info(
            "round.evaluated",
            round=t,
            rss_mb=rss,
            peak_rss_mb=peak,
            **{k: round(v, 4) for k, v in report.items()},
        )

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
            # A deliberate stop is the command's one error line; anything else is logged.
            level = logging.DEBUG if isinstance(exc, MqttflError) else logging.ERROR
            self.log.log(level, "client.failed", error=error[:300])
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
                except BrokerError:
                    pass  # stopping because the bus stopped: our will says offline
                finally:
                    for task in tasks:
                        task.cancel()
        return 0
