"""The coordinator: the adapter between the round engine and the MQTT bus.

It decodes every message from the broker (:mod:`mqttfl.wire.control`, the upload gate),
within its sender's budget (:mod:`mqttfl.nodes.screen`), hands the engine what survived,
performs the engine's actions (announce a round, checkpoint and publish its downlinks,
finish) and wakes the engine at its timers. It keeps the run's lease (run_lease.py). The
round logic itself lives in :mod:`mqttfl.engine.rounds`, with no MQTT in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus, Incoming
from mqttfl.config import RunConfig
from mqttfl.engine.actions import (
    Action,
    Announce,
    ClientRecord,
    Close,
    Finish,
    Keep,
    Rebroadcast,
)
from mqttfl.engine.budget import MAX_SENDERS, RATES
from mqttfl.engine.buffered import engine_for
from mqttfl.engine.journal import Journal
from mqttfl.engine.state import Resume, RunState, RunSummary, check_resume
from mqttfl.errors import BrokerError, RejectedUpload, RunAborted, WireError
from mqttfl.logs import get_logger, tag_process
from mqttfl.nodes.manifest import keep_copy, manifest_of
from mqttfl.nodes.run_board import RunBoard
from mqttfl.nodes.run_lease import LeaseGuard, my_lease
from mqttfl.nodes.screen import LEASE, Screen
from mqttfl.wire import Topics
from mqttfl.wire.control import RunStatus, read_ack, read_metrics, read_site_notice, read_status
from mqttfl.wire.downlinks import DownlinkPayloads
from mqttfl.wire.lease import Lease
from mqttfl.wire.resend import RESEND_REASONS, Resend
from mqttfl.wire.topics import (
    AckTopic,
    LeaseTopic,
    MetricsTopic,
    SiteTopic,
    StatusTopic,
    UploadTopic,
)

__all__ = ["Coordinator", "RunAborted"]

# What an upload's envelope adds to its body's arrays (type, run, round, sender, field
# names, array headers): room enough for any method's upload.
ENVELOPE_SLACK = 4096
# Requests to one client to send one round's upload again: a bound against loops.
MAX_RESEND_REQUESTS = 20


def topic_sender(topic: str) -> str:
    """The client a topic is about (its last level): partial messages are bounded per sender."""
    return topic.rpartition("/")[2]


class Coordinator:
    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        out_dir: Path,
        *,
        credentials: Credentials | None = None,
        fresh_session: bool = False,
        resume: Resume | None = None,
    ) -> None:
        """``fresh_session``: drop what the broker still queues for this run's coordinator
        client id (a cleared run's leftovers) instead of taking it in. ``resume``: the run
        dir as :func:`~mqttfl.engine.state.check_resume` read it (read now if not given);
        what a crash left there is set aside here."""
        self.config = config
        self.topics = Topics(config.run_id)
        self.journal = Journal(out_dir)
        if resume is None:
            resume = check_resume(self.journal, config)
        resume.apply(get_logger(run_id=config.run_id, client_id="coordinator"))
        algorithm = get_algorithm(config.method)
        self.ctx = make_context(config)
        self.engine = engine_for(config)(
            config,
            algorithm,
            self.ctx,
            clock=time.monotonic,
            state=resume.state,
            records=resume.records if resume.state else None,
        )
        self.wake = asyncio.Event()
        self._requests: set[asyncio.Future[int | None]] = set()  # resend requests on their way
        self._syncing: asyncio.Task[None] | None = None
        self.log = get_logger(run_id=config.run_id, client_id="coordinator")
        self.lease = lease = my_lease()
        self.guard = LeaseGuard(lease, time.monotonic)
        self._stepped_at = ""  # when the engine last stepped (UTC, as log lines stamp it)
        self.screen = Screen(
            self.engine,
            self.topics,
            time.monotonic,
            max_senders=max(MAX_SENDERS, 4 * config.federation.num_clients),
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._asserting = False  # our lease is about to be published again
        self.manifest = manifest_of(config, self.engine.state.instance)
        self.bus = Bus(
            broker,
            identifier=f"mqttfl-{config.run_id}-coordinator",
            subscriptions=[
                self.topics.any_status,
                self.topics.any_ack,
                self.topics.any_up,
                self.topics.any_metrics,
                self.topics.any_site,
                self.topics.lease,  # to answer a second coordinator, and to keep the lease
            ],
            credentials=credentials,
            keepalive_s=config.broker.keepalive_s,
            connect_timeout_s=config.broker.connect_timeout_s,
            persistent_session=True,  # uploads sent while we reconnect wait for us
            max_message_bytes=config.broker.max_message_bytes,
            max_reassembled_bytes=config.federation.max_upload_bytes,
            sender_of=topic_sender,
            on_connection=self._on_connection,
            # The run's lease: live while we are connected, gone (our will) when we die.
            will=(self.topics.lease, Lease(False, lease.host, lease.pid, lease.since).encode()),
            birth=lambda: [(self.topics.lease, lease.encode(), True)],
            who=f"the coordinator of run {config.run_id!r}",
            fresh_session=fresh_session,
        )
        self.resend_requests: dict[tuple[int, str], int] = {}
        self.board = RunBoard(
            self.bus,
            self.topics,
            self.manifest,
            throttled=self.screen.throttled,
            instance=lambda: self.engine.state.instance,
            wake=self.wake,
        )

    @property
    def state(self) -> RunState:
        return self.engine.state

    @property
    def clients(self) -> dict[str, ClientRecord]:
        return self.engine.clients

    @property
    def server(self) -> Any:
        return self.engine.server

    @property
    def gate(self) -> Any:
        return self.engine.gate

    # --- inbox ---------------------------------------------------------------------------
    def _on_connection(self, connected: bool) -> None:
        if connected:
            self.engine.on_broker_back()
        else:
            self.engine.on_broker_lost()
            self.guard.lost_at = time.monotonic()
        self.wake.set()

    def handle(self, message: Incoming) -> bool:
        """Screen, decode, validate and hand one message to the engine; a bad one is
        counted (and logged within the budgets of its sender and of the log), and never
        escapes. False when the screen dropped it (the engine has nothing new)."""
        read = False

        def step() -> None:
            nonlocal read
            where = self.screen.where(message)
            read = self.screen.admit(where, message) == "read"
            if read:
                self.process(message)

        self._guarded(message, step)
        return read

    def _guarded(self, message: Incoming, step: Callable[[], None]) -> None:
        try:
            step()
        except RejectedUpload as exc:
            if self.screen.may_log(exc.reason):
                event = "upload.late" if exc.reason == "stale" else "upload.rejected"
                self.log.warning(
                    event,
                    round=exc.round,
                    client=exc.client,
                    reason=exc.reason,
                    detail=exc.detail,
                    bytes=len(message.payload),
                )
        except WireError as exc:
            self.state.rejected_messages[exc.reason] += 1
            if self.screen.may_log(exc.reason):
                self.log.warning(
                    "message.rejected",
                    topic=message.topic[:200],
                    reason=exc.reason,
                    detail=exc.detail,
                )
        for sender in self.screen.budget.newly_named():
            self._throttled(sender)

    def release_held(self) -> bool:
        """Read the held state messages whose senders have a token again (True if any);
        the inbox calls it after every message, and a test may call it to drive the screen."""
        released = self.screen.release()
        for message in released:
            self.screen.quiet = False
            self._guarded(message, functools.partial(self.process, message))
        held = self.screen.budget.summary_due()
        if held:
            self.log.warning("messages.held_back", reasons=held, note="rejections not logged")
        return bool(released)

    def _throttled(self, sender: str) -> None:
        """Name a sender past its budget, once; the run state lists it for `watch`."""
        kind = self.screen.budget.named[sender]
        rate = RATES[kind]
        self.log.warning(
            "client.throttled", client=sender, budget=kind, per_s=rate.per_s, burst=rate.burst
        )
        if "/" not in sender and self.board.status is not None:
            self._spawn(self.board.publish_state())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), BrokerError):
            self.log.warning("publish.failed", error=str(task.exception()))

    def _on_lease(self, raw: bytes) -> None:
        verdict = self.guard.judge(raw)
        if verdict == "yield":
            raise self.guard.yielded(self.config.run_id, raw)
        if verdict == "ignore":
            return
        if verdict == "restore" and self.guard.restored & (self.guard.restored - 1) == 0:
            self.log.warning(  # at the 1st, 2nd, 4th, 8th ... time: a flood logs few lines
                "lease.restored",
                found=raw[:200].decode(errors="replace"),
                times=self.guard.restored,
            )
        if not self._asserting:  # one answer on its way at a time, within the lease's budget
            self._asserting = True
            self._spawn(self._assert_lease())

    async def _assert_lease(self) -> None:
        budget = self.screen.budget
        try:
            await asyncio.sleep(max(budget.ready_at(LEASE, "state") - time.monotonic(), 0.0))
            budget.admit(LEASE, "state")
        finally:
            self._asserting = False
        await self.bus.publish(self.topics.lease, self.guard.mine, retain=True, timeout=10)

    def process(self, message: Incoming) -> None:
        """Decode and hand one message to the engine (``handle`` screens it first).

        A hook: a subclass may wrap it to watch what the engine accepts (benchmarks/loadfed.py
        times every accepted upload); errors it raises are ``handle``'s to count."""
        if message.error is not None:  # chunks that could not be put together
            self._ask_resend(message)
            raise message.error
        run = self.config.run_id
        match self.topics.parse(message.topic):
            case StatusTopic(client):
                if message.payload:
                    self.engine.on_status(read_status(message.payload, run_id=run, client=client))
                else:  # a cleared status: a device waiting for the manifest (nodes/manifest.py)
                    self.board.manifest_asked()
            case SiteTopic(site):
                self.engine.on_site(site, read_site_notice(message.payload))
            case LeaseTopic():
                self._on_lease(message.payload)
            case AckTopic(t, client):
                self.engine.on_ack(read_ack(message.payload, run_id=run, round=t, client=client))
            case UploadTopic(t, client):
                try:
                    taken = self.engine.on_upload(t, client, message.payload, message.wire_bytes)
                except RejectedUpload as exc:
                    exc.round, exc.client = t, client
                    raise
                event = "upload.accepted" if taken is not None else "upload.held"
                self.log.debug(event, round=t, client=client, bytes=len(message.payload))
            case MetricsTopic(t, client):
                metrics = read_metrics(message.payload, run_id=run, round=t, client=client)
                record = self.engine.on_metrics(metrics)
                if record is not None:
                    self.journal.append_metrics(record)
            case other:
                raise WireError("topic", f"the coordinator does not take {other.kind} messages")

    def _ask_resend(self, message: Incoming) -> None:
        """An upload of the open round that could not be put together (refused for room,
        given up on, corrupted): ask its sender to send it again, within the round."""
        error = message.error
        if error is None or error.reason not in RESEND_REASONS or message.message_id is None:
            return
        try:
            where = self.topics.parse(message.topic)
        except WireError:
            return
        if not isinstance(where, UploadTopic):
            return
        t, client, gate = where.round, where.client, self.engine.gate
        if not gate.open or t != gate.round or client not in gate.selected:
            return
        if client in gate.accepted:
            return
        key = (t, client)
        asked = self.resend_requests.get(key, 0)
        if asked >= MAX_RESEND_REQUESTS:
            return
        self.resend_requests[key] = asked + 1
        self.log.info("upload.resend_asked", round=t, client=client, reason=error.reason)
        request = Resend(t, client, error.reason, message.message_id).encode(self.config.run_id)
        task = asyncio.ensure_future(self.bus.publish(self.topics.down(t, client), request))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    def _size_reassembly(self) -> None:
        """Room for partial uploads: what this round can legitimately bring, the selected
        clients' largest valid uploads; each sender at most its largest."""
        engine, gate = self.engine, self.engine.gate
        sizes = [
            gate.schema_for(engine.clients[c].info).max_bytes() + ENVELOPE_SLACK
            for c in gate.selected
            if c in engine.clients
        ]
        if not sizes:
            return
        limit = self.config.federation.max_upload_bytes
        self.bus.reassembler.resize(
            buffered=sum(min(size, limit) for size in sizes),
            per_sender=max(sizes),
            expected=gate.selected,
        )

    async def _inbox(self) -> None:
        while True:
            if self.handle(await self.bus.incoming.get()) | self.release_held():
                self.wake.set()  # (a flood the screen drops never wakes the round loop)

    # --- actions -------------------------------------------------------------------------
    async def _perform(self, action: Action) -> None:
        run = self.config.run_id
        if isinstance(action, Keep):  # buffered mode: the buffer changed
            await self._synced_checkpoint()
            self.journal.save_checkpoint(action.checkpoint, sync=False)
            self._syncing = asyncio.create_task(asyncio.to_thread(self.journal.sync_checkpoint))
        elif isinstance(action, Announce):
            t = action.start.round
            structlog.contextvars.bind_contextvars(round=t)
            # after the round before's `round.closed`; chosen_at: when its clients were chosen
            self.log.info("round.started", chosen_at=self._stepped_at, **action.fields())
            self._size_reassembly()
            await self.board.publish_state(action.status)
            await self.bus.publish(self.topics.start(t), action.start.encode(run))
        elif isinstance(action, Close):
            await self._close(action)
        elif isinstance(action, Rebroadcast):
            broadcast = self.topics.down_all(action.round)
            await self.bus.publish(broadcast, action.broadcast, retain=True)
        else:
            await self._synced_checkpoint()
            self.journal.write_summary(action.summary)
            last = self.engine.state.round
            ended = action.summary.ended_early or ""
            await self.board.publish_state(
                RunStatus("finished", last, finished_at=time.time(), ended=ended)
            )
            self.log.info("run.summary", mean=action.summary.mean.model_dump())

    async def _close(self, action: Close) -> None:
        t, began = action.round, time.monotonic()
        if action.checkpoint is not None:
            # Checkpoint before publishing: a crash from here on re-publishes, never
            # re-aggregates. Written to the page cache now (it survives our process dying);
            # the fsync that makes it survive a power cut runs while the downlinks go out.
            await self._synced_checkpoint()
            self.journal.save_checkpoint(action.checkpoint, sync=False)
            self._syncing = asyncio.create_task(asyncio.to_thread(self.journal.sync_checkpoint))
        await self.publish_downlinks(t, action.payloads)
        await self.board.publish_state(RunStatus("closed", t))
        if action.checkpoint is not None:
            self.log.info(
                "round.closed", round=t, seconds=round(time.monotonic() - began, 3), **action.log
            )

    async def publish_downlinks(self, t: int, payloads: DownlinkPayloads) -> None:
        """Publish round ``t``'s downlinks, after its checkpoint. A hook: a subclass may wrap
        it (benchmarks/loadfed.py times it)."""
        # Pipelined: one broker round trip for all of them, not one per client. Only the
        # newest broadcast stays retained, for late joiners: the broker takes one
        # connection's messages in order, so round t-1's is cleared after t's is kept.
        await asyncio.gather(
            *(
                self.bus.publish(self.topics.down(t, client), payload)
                for client, payload in payloads.personal.items()
            ),
            self.bus.publish(self.topics.down_all(t), payloads.broadcast, retain=True),
            *([self.bus.publish(self.topics.down_all(t - 1), b"", retain=True)] if t > 1 else []),
        )

    async def _synced_checkpoint(self) -> None:
        """Wait for the previous checkpoint's fsync (one at a time; errors surface here)."""
        if self._syncing is not None:
            await self._syncing
            self._syncing = None

    # --- whole run -----------------------------------------------------------------------
    async def run(self) -> RunSummary | None:
        async with asyncio.TaskGroup() as group:
            bus_task = group.create_task(self.bus.run())
            try:
                await self.bus.wait_connected(timeout=self.config.broker.connect_timeout_s)
                inbox_task = group.create_task(self._inbox())
                try:
                    summary = await self._loop()
                finally:
                    inbox_task.cancel()
                    await self._release()
            finally:
                bus_task.cancel()
        return summary

    async def _loop(self) -> RunSummary | None:
        engine = self.engine
        tag_process(instance=engine.state.instance)
        self.log.info(
            "run.started",
            method=self.config.method,
            rounds=self.config.rounds,
            expected_clients=self.config.federation.num_clients,
            from_round=engine.round,
        )
        # The run's contract, for every other process of the run (and a copy for readers
        # of the run dir): published before anything else, kept across resumes.
        keep_copy(self.manifest, self.journal.out_dir)
        await self.board.publish_manifest()
        if engine.state.round == 0:
            await self.board.publish_state(RunStatus("waiting", 0))
        summary: RunSummary | None = None
        while not engine.finished:
            self.wake.clear()
            self._stepped_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            for action in engine.step():
                await self._perform(action)
                if isinstance(action, Finish):
                    summary = action.summary
            if engine.finished:
                break
            self.release_held()
            asked_at = await self.board.answer()
            engine_at = engine.wake_at()
            wake_at = min(
                math.inf if engine_at is None else engine_at, self.screen.next_release, asked_at
            )
            timeout = None if wake_at == math.inf else max(wake_at - time.monotonic(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)
        await self._synced_checkpoint()
        return summary

    async def _release(self) -> None:
        """Give the run's lease up (a clean disconnect sends no last will)."""
        if self.bus.connected.is_set() and not self.guard.releasing:
            self.guard.releasing = True
            released = Lease(False, self.lease.host, self.lease.pid, self.lease.since)
            try:
                await self.bus.publish(self.topics.lease, released.encode(), retain=True, timeout=5)
            except BrokerError as exc:
                self.log.warning("lease.unreleased", error=str(exc))

    def summary(self) -> RunSummary:
        return self.engine.summary()
