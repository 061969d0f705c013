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
from mqttfl.bus.transport import Incoming
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.errors import BrokerError, MqttflError, StateError, WireError
from mqttfl.logs import get_logger, tag_process
from mqttfl.nodes import client_privacy
from mqttfl.nodes.client_bus import client_bus
from mqttfl.nodes.client_inbox import PendingDownlink, Received, read_for_client
from mqttfl.nodes.client_machine import ClientRounds
from mqttfl.nodes.client_state import Owner, Progress, Snapshot, StateFile, state_path
from mqttfl.nodes.client_uploads import Uploads
from mqttfl.nodes.client_watch import RunWatch
from mqttfl.nodes.device import build_client_side, round_rng
from mqttfl.nodes.manifest import follow_instance, kept_manifest
from mqttfl.nodes.run_lease import finished_text
from mqttfl.training.memory import IDLE, resident_mb
from mqttfl.training.metrics import classification_report
from mqttfl.wire import Message, Topics, check_id, encode
from mqttfl.wire.control import Ack, Metrics, Offline, Online, RoundStart, RunStatus
from mqttfl.wire.downlinks import Downlink
from mqttfl.wire.lease import Lease
from mqttfl.wire.resend import Resend

T = TypeVar("T")

HEAL_INTERVAL_S = 1.0  # at most one re-announcement per second after a forged 'offline'


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
        on_demand = algorithm.fetched_on_demand(config)
        # the round machine: what this client has seen of the run and will do about it
        self.rounds = ClientRounds(
            client_id,
            time.monotonic,
            buffered=config.federation.mode == "buffered",
            privacy=self.ctx.privacy,
            on_demand=on_demand,
            last_round=config.rounds,
        )
        self.progress = self.rounds.progress  # changed in place: loaded, saved, put back
        self.last_loss = 0.0
        self.finished = asyncio.Event()
        self.failed = False  # a loop died and said so in its offline status
        self.work: asyncio.Queue[Received] = asyncio.Queue()
        self._healed = -HEAL_INTERVAL_S
        self._acting = ("", 0)  # the kind and round of the message the worker acts on
        self.log = get_logger(run_id=config.run_id, client_id=client_id)
        self.state_file = StateFile(
            state_path(state_dir, config.run_id, client_id),
            Owner.of(config, self.info),
            log=self.log,
        )
        self.state_file.fresh = self._fresh_state
        # the manifest this device's settings came from (None: given directly)
        self.manifest = kept_manifest(self.state_file.path.parent)
        resumed = self.state_file.load(self.model, self.method, self.progress)
        if resumed:
            self.log.info(
                "client.resumed",
                trained_round=self.progress.trained_round,
                applied_round=self.progress.applied_round,
            )
        online = Online(client_privacy.announced(self.info, self.ctx)).encode(config.run_id)
        self.bus = client_bus(
            config, client_id, broker, online, credentials=credentials, fetch_broadcasts=on_demand
        )
        self.uploads = Uploads(self.bus, self.topics, self.client_id, self.log)
        orphaned_after = config.broker.orphan_timeout_s
        self.watch = RunWatch(config.run_id, client_id, orphaned_after, self.bus.connected)
        self.broker = broker
        self.state_seen = False  # the run's state, the first time: a finished run is not ours
        self.releases = client_privacy.Releases(self.state_file.path, self.log)

    def _fresh_state(self) -> Snapshot:
        """The state this client had when built (the model from ``config.seed``), built
        again: rarely needed (a state set aside), so not kept beside the live model."""
        algorithm = get_algorithm(self.config.method)
        side = build_client_side(self.config, algorithm, self.ctx, self.client_id, self.shard)
        return StateFile.snapshot(side.model, side, Progress())

    # --- reading: decode, validate, acknowledge -----------------------------------------------
    def _read(self, incoming: Incoming) -> Received | None:
        """Validate one message; raise WireError for anything hostile."""
        read = read_for_client(
            incoming, config=self.config, client_id=self.client_id, method=self.method
        )
        if isinstance(read, Offline):
            self._heal(read)
            return None
        if isinstance(read, Lease):
            self.watch.on_lease(read)
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
        online = Online(client_privacy.announced(self.info, self.ctx)).encode(self.config.run_id)
        self._spawn(
            self.bus.publish(self.topics.status(self.client_id), online, retain=True, timeout=30)
        )

    async def _off_loop(self, func: Callable[..., T], /, *args: Any) -> T:
        """Run ``func`` off the event loop, so the MQTT keep-alive goes on meanwhile; the
        process's freed heap goes back to the OS once it has been idle a while."""
        call = functools.partial(contextvars.copy_context().run, func, *args)
        IDLE.begin()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, call)
        finally:
            IDLE.end()

    def _spawn(self, coroutine: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("publish.failed", error=str(task.exception()))

    def _acknowledge(self, start: RoundStart) -> None:
        """Tell the coordinator at once that we are alive and will train (before any
        queued evaluation or training delays us), or why we will not."""
        reason = self.rounds.acknowledge(start)
        if reason is None:
            return
        if reason == "budget_spent":  # it leaves the run now: its 'offline' says why
            self._spawn(self._leave_spent(start.round))
            return
        if reason:  # a start we will not act on: the round need not wait for us
            self.log.info("round.declined", round=start.round, reason=reason)
        ack = Ack(start.round, self.client_id, start.announcement, reason)
        topic = self.topics.ack(start.round, self.client_id)
        self._spawn(self.bus.publish(topic, ack.encode(self.config.run_id), timeout=30))

    async def _leave_spent(self, t: int) -> None:
        """[privacy]'s budget cannot pay round t's upload: say ``offline`` with the reason
        (the coordinator never selects us again) and end the run."""
        privacy = self.ctx.privacy
        if privacy is None or self.finished.is_set():
            return
        offline = client_privacy.budget_exhausted(
            privacy, self.client_id, self.config.run_id, t, self.progress.uploads, self.log
        )
        await self.bus.publish(self.topics.status(self.client_id), offline, retain=True, timeout=5)
        self.finished.set()

    async def _reader(self) -> None:
        while True:  # a message's payload and decoded body go with _take's frame
            self._take(await self.bus.incoming.get())

    def _take(self, incoming: Incoming) -> None:
        if not incoming.payload and incoming.error is None:
            return  # a cleared retained message
        try:
            received = self._read(incoming)
        except WireError as exc:
            self.log.warning(
                "message.rejected", topic=incoming.topic[:200], reason=exc.reason, detail=exc.detail
            )
            return
        if received is not None:
            self._route(received)

    def _route(self, received: Received) -> None:
        message = received.message
        self.watch.on_coordinator()
        if isinstance(message, RunStatus | RoundStart):
            settings = message.settings if isinstance(message, RunStatus) else ""
            self._see_instance(message.instance, settings)
            for u in self.rounds.fetches(message):
                self._spawn(self.bus.subscribe(self.topics.down_all(u)))
        if isinstance(message, RunStatus):
            self._check_not_finished_before(message)
        if isinstance(message, RunStatus) and message.start is not None:
            message = message.start
        if isinstance(message, RoundStart):
            self._acknowledge(message)
        if isinstance(message, Resend):
            self._spawn(self.uploads.resend_asked(message, self.rounds.closed_round))
        else:
            self.work.put_nowait(received)

    def _see_instance(self, instance: str, settings: str) -> None:
        """The run names its instance: a state of another one is set aside before the
        worker acts on anything more (:meth:`_start_afresh`); settings of another
        instance's manifest go on only where they are the run's (:func:`follow_instance`)."""
        if (kept := self.manifest) is not None:
            folder, me = self.state_file.path.parent, self.client_id
            self.manifest = follow_instance(kept, instance, settings, folder, client_id=me)
            if self.manifest is not kept:
                self.log.info("manifest.renewed", instance=instance, previous=kept.instance)
        resumed = self.rounds.see_instance(instance)
        if resumed is not None:
            tag_process(instance=instance)
            self.log.info("run.joined", instance=instance, resumed=resumed)

    def _check_not_finished_before(self, status: RunStatus) -> None:
        """The first state we see says the run finished without us: its id was used
        before (a silent exit 0 would look like success)."""
        first, self.state_seen = not self.state_seen, True
        if first and status.phase == "finished" and self.rounds.seen().applied_round < status.round:
            raise StateError(finished_text(self.config.run_id, status, self.broker))

    # --- acting --------------------------------------------------------------------------
    async def _worker(self) -> None:
        while True:
            try:  # handed over whole: a downlink _act has applied is held by no frame
                await self._act(await self.work.get())
            except Refused:
                raise  # the broker refuses our uploads: nothing we report would count
            except Exception as exc:  # one message never ends the client
                kind, t = self._acting
                error = f"{type(exc).__name__}: {exc}"[:300]
                self.log.warning("message.failed", kind=kind, round=t, error=error)

    async def _act(self, received: Received) -> None:
        message = received.message
        self._acting = (type(message).__name__, message.round)
        assert not isinstance(message, Resend)  # handled by the reader
        if self.rounds.next_instance:
            await self._start_afresh()
        if isinstance(message, Downlink):
            self.rounds.take_downlink(message, broadcast=received.broadcast, size=received.size)
            del message, received  # the machine holds it until it is applied
            await self._apply_ready()
            if (held := self.rounds.release_start()) is not None:
                await self._on_start(*held)  # the broadcast it waited for is in
            return
        if self.rounds.on_progress(message):
            self.log.info("run.finishing", round=message.round)
        start = message.start if isinstance(message, RunStatus) else message
        await self._apply_ready()  # the last round's downlinks before the next round's training
        if start is not None:
            await self._on_start(start, received.received)

    async def _on_start(self, start: RoundStart, received: float) -> None:
        if self.client_id not in start.selected:
            return
        if self.rounds.waits_for_broadcast(start, received):
            self.log.debug("training.waiting", round=start.round, reason="fetching the broadcast")
            return
        if self.uploads.should_resend(start, received, self.progress.trained_round):
            await self.uploads.resend(
                start, received, functools.partial(self._upload_of, start.round)
            )
        await self._train_round(start, received)

    async def _decline(self, start: RoundStart, reason: str) -> None:
        """Tell the coordinator that we will not upload round t, so that the round does not
        wait for us to its deadline."""
        notice = Ack(start.round, self.client_id, start.announcement, reason)
        topic = self.topics.ack(start.round, self.client_id)
        await self.bus.publish(topic, notice.encode(self.config.run_id), timeout=30)

    async def _drop_round(self, start: RoundStart, before: Snapshot, reason: str) -> None:
        """This round's update is dropped: the next round starts from the model, optimizer
        and method state of ``before`` (no gradients kept), and goes on without us."""
        StateFile.restore(before, self.model, self.method, self.progress)
        self.model.zero_grad(set_to_none=True)
        self.rounds.refused_round = start.round
        await self._decline(start, reason)

    async def _upload_of(self, t: int) -> bytes | None:
        """Round t's upload made anew (restarted since: the model on disk is t's); with
        [privacy], the one released, as it was (None: not kept, never released twice)."""
        if self.ctx.privacy is not None:
            return self.releases.kept(t, self.progress.instance)
        body = await self._off_loop(self.method.make_upload, t)
        self.schema.validate(body)
        return encode(Message("upload", self.config.run_id, t, self.client_id, dict(body)))

    async def _start_afresh(self) -> None:
        """Our state is of another instance of this run id: set it aside, train afresh."""
        held = self.progress.instance or "none recorded"
        await self.state_file.start_afresh(
            self.model,
            self.method,
            self.progress,
            f"it holds round {self.progress.trained_round} of instance {held} of run "
            f"{self.config.run_id!r}, which was started again as instance "
            f"{self.rounds.next_instance}",
        )
        instance = self.rounds.start_afresh()
        tag_process(instance=instance)
        self.log.info("run.joined", instance=instance, resumed=False)
        self.uploads.forget()

    async def _train_round(self, start: RoundStart, received: float) -> None:
        t = start.round
        verdict = self.rounds.train_verdict(start, received)
        if verdict == "skip":
            return
        log = self.log.bind(round=t)
        if verdict == "deadline_passed":
            log.warning("round.skipped", reason="deadline already passed")
            await self._decline(start, "deadline_passed")
            return
        if not self.rounds.charge():  # [privacy]'s budget is spent: it leaves the run
            await self._leave_spent(t)
            return
        began = time.monotonic()
        self.rounds.training_round = t
        before = StateFile.snapshot(self.model, self.method, self.progress)
        try:
            log.info("training.started", selected=len(start.selected))
            rng = round_rng(self.config.seed, self.info, t)
            params = dict(start.params)
            loss = await self._off_loop(self.method.train, t, params, rng)
            body = await self._off_loop(self.method.make_upload, t)
        except Exception as exc:  # out of memory, a bug: declined, so the round need not wait
            log.warning("training.failed", error=f"{type(exc).__name__}: {exc}"[:300])
            await self._drop_round(start, before, "training_failed")
            return
        finally:
            self.rounds.training_round = 0
        try:  # refuse to publish anything the method does not permit
            self.schema.validate(body)
        except WireError as exc:  # diverged training: weights past the method's bound
            log.warning(
                "upload.refused",
                reason=exc.reason,
                detail=exc.detail,
                train_loss=round(float(loss), 4),
            )
            await self._drop_round(start, before, exc.reason[:64] or "refused")
            return
        payload = encode(Message("upload", self.config.run_id, t, self.client_id, dict(body)))
        self.rounds.trained(t, len(payload))
        self.last_loss = float(loss)
        if self.ctx.privacy is not None:  # kept, and the state that charged it, before it goes
            await self.releases.keep(t, self.progress.instance, payload)
            await self.state_file.save(self.model, self.method, self.progress)
            await self.state_file.written()
        await self.uploads.send(t, start.announcement, payload)
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

    async def _apply_ready(self) -> None:
        while (ready := self.rounds.next_to_apply()) is not None:
            if ready.personal_missing:
                self.log.warning("downlink.personal_missing", round=ready.round)
            t, size = ready.round, ready.pending.size
            self._receive(t, ready.pending)
            del ready  # in the model now: not held while the scoring waits for a worker
            await self._apply(t, size)
        for u in self.rounds.fetched():
            self._spawn(self.bus.unsubscribe(self.topics.down_all(u)))
        if self.rounds.done:
            self.finished.set()

    def _receive(self, t: int, pending: PendingDownlink) -> None:
        assert pending.broadcast is not None
        personal = dict(pending.personal.body) if pending.personal is not None else None
        self.method.receive(t, dict(pending.broadcast.body), personal)

    async def _apply(self, t: int, size: int) -> None:
        kept = self.rounds.keeps(t, self.config.rounds)
        if not self.rounds.scores(t, self.config.federation.evaluate, self.config.rounds):
            self.rounds.applied(t)
            if kept:
                await self.state_file.save(self.model, self.method, self.progress)
            self.log.debug("downlink.applied", round=t, scored=False, kept=kept)
            return
        predicted = await self._off_loop(self.method.predict, self.shard.x_test)
        report = classification_report(self.shard.y_test, predicted)
        extra = await self._off_loop(
            self.method.extra_metrics, self.shard.x_test, self.shard.y_test
        )
        bytes_up = self.rounds.applied(t)
        if kept:
            await self.state_file.save(self.model, self.method, self.progress)
        values = {
            **extra,
            **report,
            "num_test": len(self.shard.y_test),
            "bytes_up": bytes_up,
            "bytes_down": size,
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
            self.failed = True  # run() then says no plain "exit" over this reason
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
        client_privacy.warn_if_noise_drowns(self.ctx, self.schema, self.shard.y_train, self.log)
        offline = Offline(self.client_id, "exit").encode(self.config.run_id)
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self.bus.run()),
                group.create_task(self._last_words(self._reader())),
                group.create_task(self._last_words(self._worker())),
                group.create_task(self.watch.run()),
            ]
            try:
                await self.bus.wait_connected(timeout=self.config.broker.connect_timeout_s)
                await self.finished.wait()
                await self.state_file.written()
                self.log.info("run.finished")
            finally:
                # Stopping for any reason: say so first, so the coordinator knows at once.
                try:
                    if self.bus.connected.is_set() and not self.failed:
                        await self.bus.publish(
                            self.topics.status(self.client_id), offline, retain=True, timeout=5
                        )
                except BrokerError:
                    pass  # stopping because the bus stopped: our will says offline
                finally:
                    for task in tasks:
                        task.cancel()
        return 0
