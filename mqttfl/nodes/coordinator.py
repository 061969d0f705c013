"""The coordinator: the adapter between the round engine and the MQTT bus.

It decodes every message from the broker (:mod:`mqttfl.wire.control`, the upload gate),
hands the engine what survived, performs the engine's actions (announce a round,
checkpoint and publish its downlinks, finish) and wakes the engine at its timers. The
round logic itself lives in :mod:`mqttfl.engine.rounds`, with no MQTT in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import structlog

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.bus.transport import BrokerAddress, Bus, Credentials, Incoming
from mqttfl.config import RunConfig
from mqttfl.engine.journal import Journal
from mqttfl.engine.rounds import Announce, Close, Finish, RoundEngine
from mqttfl.engine.state import RunState
from mqttfl.errors import RejectedUpload, RunAborted, WireError
from mqttfl.logs import get_logger
from mqttfl.wire import Topics
from mqttfl.wire.control import (
    DownlinkPayloads,
    RunStatus,
    read_ack,
    read_metrics,
    read_site_notice,
    read_status,
)

__all__ = ["Coordinator", "RunAborted"]


class Coordinator:
    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        out_dir: Path,
        *,
        credentials: Credentials | None = None,
    ) -> None:
        self.config = config
        self.topics = Topics(config.run_id)
        self.journal = Journal(out_dir)
        algorithm = get_algorithm(config.method)
        self.ctx = make_context(config)
        saved = self.journal.load_checkpoint()
        state = None
        if saved is not None:
            state = RunState.from_dict(saved, config, source=str(self.journal.checkpoint_path))
        self.engine = RoundEngine(
            config,
            algorithm,
            self.ctx,
            clock=time.monotonic,
            state=state,
            records=self.journal.read_metrics() if state else None,
        )
        self.wake = asyncio.Event()
        self._syncing: asyncio.Task[None] | None = None
        self.log = get_logger(run_id=config.run_id, client_id="coordinator")
        self.bus = Bus(
            broker,
            identifier=f"mqttfl-{config.run_id}-coordinator",
            subscriptions=[
                self.topics.any_status,
                self.topics.any_ack,
                self.topics.any_up,
                self.topics.any_metrics,
                self.topics.any_site,
            ],
            credentials=credentials,
            keepalive_s=config.broker.keepalive_s,
            connect_timeout_s=config.broker.connect_timeout_s,
            persistent_session=True,  # uploads sent while we reconnect wait for us
            max_message_bytes=config.broker.max_message_bytes,
            max_reassembled_bytes=config.federation.max_upload_bytes,
            on_connection=self._on_connection,
        )

    @property
    def state(self) -> RunState:
        return self.engine.state

    @property
    def clients(self) -> dict[str, Any]:
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
        self.wake.set()

    def handle(self, message: Incoming) -> None:
        """Decode, validate and hand one message to the engine; a bad one is counted and
        logged with its reason, and never escapes."""
        try:
            self._handle(message)
        except RejectedUpload as exc:
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
            self.log.warning(
                "message.rejected", topic=message.topic[:200], reason=exc.reason, detail=exc.detail
            )

    def _handle(self, message: Incoming) -> None:
        if message.error is not None:  # chunks that could not be put together
            raise message.error
        where = self.topics.parse(message.topic)
        run, client, t = self.config.run_id, where.client, where.round
        if where.kind == "status" and client is not None:
            if message.payload:  # an empty payload clears a retained status
                self.engine.on_status(read_status(message.payload, run_id=run, client=client))
        elif where.kind == "site" and client is not None:
            self.engine.on_site(client, read_site_notice(message.payload))
        elif where.kind == "ack" and client is not None and t is not None:
            self.engine.on_ack(read_ack(message.payload, run_id=run, round=t, client=client))
        elif where.kind == "up" and client is not None and t is not None:
            try:
                self.engine.on_upload(t, client, message.payload, message.wire_bytes)
            except RejectedUpload as exc:
                exc.round, exc.client = t, client
                raise
            self.log.debug("upload.accepted", round=t, client=client, bytes=len(message.payload))
        elif where.kind == "metrics" and client is not None and t is not None:
            metrics = read_metrics(message.payload, run_id=run, round=t, client=client)
            record = self.engine.on_metrics(metrics)
            if record is not None:
                self.journal.append_metrics(record)
        else:
            raise WireError("topic", f"the coordinator does not take {where.kind} messages")

    async def _inbox(self) -> None:
        while True:
            self.handle(await self.bus.incoming.get())
            self.wake.set()

    # --- actions -------------------------------------------------------------------------
    async def _perform(self, action: Announce | Close | Finish) -> None:
        run = self.config.run_id
        if isinstance(action, Announce):
            t = action.start.round
            structlog.contextvars.bind_contextvars(round=t)
            await self.bus.publish(self.topics.state, action.status.encode(run), retain=True)
            await self.bus.publish(self.topics.start(t), action.start.encode(run))
        elif isinstance(action, Close):
            await self._close(action)
        else:
            await self._synced_checkpoint()
            self.journal.write_summary(action.summary)
            last = self.engine.state.round
            await self.bus.publish(
                self.topics.state, RunStatus("finished", last).encode(run), retain=True
            )
            self.log.info("run.summary", mean=action.summary["mean"])

    async def _close(self, action: Close) -> None:
        t, began = action.round, time.monotonic()
        if action.checkpoint is not None:
            # Checkpoint before publishing: a crash from here on re-publishes, never
            # re-aggregates. Written to the page cache now (it survives our process dying);
            # the fsync that makes it survive a power cut runs while the downlinks go out.
            await self._synced_checkpoint()
            self.journal.save_checkpoint(action.checkpoint, sync=False)
            self._syncing = asyncio.create_task(asyncio.to_thread(self.journal.sync_checkpoint))
        await self._publish_downlinks(t, action.payloads)
        await self.bus.publish(
            self.topics.state, RunStatus("closed", t).encode(self.config.run_id), retain=True
        )
        if action.checkpoint is not None:
            self.log.info(
                "round.closed", round=t, seconds=round(time.monotonic() - began, 3), **action.log
            )

    async def _publish_downlinks(self, t: int, payloads: DownlinkPayloads) -> None:
        # Pipelined: one broker round trip for all of them, not one per client.
        await asyncio.gather(
            *(
                self.bus.publish(self.topics.down(t, client), payload)
                for client, payload in payloads.personal.items()
            ),
            self.bus.publish(self.topics.down_all(t), payloads.broadcast, retain=True),
        )
        if t > 1:  # only the newest broadcast stays retained, for late joiners
            await self.bus.publish(self.topics.down_all(t - 1), b"", retain=True)

    async def _synced_checkpoint(self) -> None:
        """Wait for the previous checkpoint's fsync (one at a time; errors surface here)."""
        if self._syncing is not None:
            await self._syncing
            self._syncing = None

    # --- whole run -----------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        async with asyncio.TaskGroup() as group:
            bus_task = group.create_task(self.bus.run())
            try:
                await self.bus.wait_connected(timeout=self.config.broker.connect_timeout_s)
                inbox_task = group.create_task(self._inbox())
                try:
                    summary = await self._loop()
                finally:
                    inbox_task.cancel()
            finally:
                bus_task.cancel()
        return summary

    async def _loop(self) -> dict[str, Any]:
        engine = self.engine
        self.log.info(
            "run.started",
            method=self.config.method,
            rounds=self.config.rounds,
            expected_clients=self.config.federation.num_clients,
            from_round=engine.round,
        )
        if engine.state.round == 0:
            await self.bus.publish(
                self.topics.state, RunStatus("waiting", 0).encode(self.config.run_id), retain=True
            )
        summary: dict[str, Any] = {}
        while not engine.finished:
            self.wake.clear()
            for action in engine.step():
                await self._perform(action)
                if isinstance(action, Finish):
                    summary = action.summary
            if engine.finished:
                break
            wake_at = engine.wake_at()
            timeout = None if wake_at is None else max(wake_at - time.monotonic(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)
        await self._synced_checkpoint()
        return summary

    def summary(self) -> dict[str, Any]:
        return self.engine.summary()
