"""The coordinator: the one round loop of mqttfl.

Each round: select a seeded fraction of the live clients, publish the start (QoS 1) and
the retained state, gather uploads until every live selected client has uploaded or the
deadline passes (a client whose last will fires leaves the round at once), aggregate if
at least ``min_clients`` uploads arrived (else re-announce the round, with the reason
logged), publish the downlinks, and checkpoint to the run dir.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.algorithms.base import ClientInfo
from mqttfl.config import RunConfig
from mqttfl.errors import MqttflError, RejectedUpload, WireError
from mqttfl.logs import get_logger
from mqttfl.runtime import messages
from mqttfl.runtime.gate import UploadGate
from mqttfl.runtime.journal import Journal, mean_over_clients, summarize_clients
from mqttfl.runtime.transport import MAX_BACKOFF_S, BrokerAddress, Bus, Credentials, Incoming
from mqttfl.wire import Topics

RESUME_LISTEN_S = 5.0  # on resume, how long to wait for the statuses of known clients
WILL_SETTLE_S = 0.5  # after last wills, how long to watch whether our own connection drops too
RETRY_GRACE_S = 3.0  # before a retry, how long to wait for the clients asked before to be back
# after a broker restart, how long the clients may take to reconnect (their backoff) and announce
RECONNECT_GRACE_S = MAX_BACKOFF_S + 3.0


class RunAborted(MqttflError):
    """The run cannot go on (too few clients after every retry)."""


@dataclass
class ClientRecord:
    info: ClientInfo
    online: bool = True


def select_clients(
    live: list[str], *, fraction: float, min_clients: int, seed: int, t: int, attempt: int
) -> list[str]:
    """A seeded sample of ceil(fraction·|live|) clients, never fewer than min_clients."""
    k = min(len(live), max(min_clients, math.ceil(fraction * len(live))))
    rng = np.random.default_rng([seed, t, attempt])
    return sorted(rng.choice(sorted(live), size=k, replace=False).tolist(), key=_order)


def _order(client: str) -> tuple[int, str]:
    return (int(client), "") if client.isdigit() else (1 << 30, client)


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
        self.fed = config.federation
        self.algorithm = get_algorithm(config.method)
        self.ctx = make_context(config)
        self.server = self.algorithm.server(self.ctx)
        self.topics = Topics(config.run_id)
        self.journal = Journal(out_dir)
        self.gate = UploadGate(self.algorithm, self.ctx, config.run_id, self.fed.max_upload_bytes)
        self.clients: dict[str, ClientRecord] = {}
        self.changed = asyncio.Event()
        self.metrics_seen: dict[int, set[str]] = {}
        self.records: list[dict[str, Any]] = []  # metrics.jsonl, kept in memory too
        self.down_bytes: dict[str, int] = {}
        self.comm = {"up_bytes": 0, "up_count": 0, "down_bytes": 0, "down_count": 0}
        self.retries = 0
        self.missing_uploads = 0
        self.rejected_messages: Counter[str] = Counter()  # non-upload messages, by reason
        self.start_round = 1
        self.resume: tuple[messages.DownlinkPayloads | None, list[str]] | None = None
        self._syncing: asyncio.Task[None] | None = None
        self.log = get_logger(run_id=config.run_id, client_id="coordinator")
        self.bus = Bus(
            broker,
            identifier=f"mqttfl-{config.run_id}-coordinator",
            subscriptions=[self.topics.any_status, self.topics.any_up, self.topics.any_metrics],
            credentials=credentials,
            keepalive_s=config.broker.keepalive_s,
            persistent_session=True,  # uploads sent while we reconnect wait for us
        )

    # --- inbox ----------------------------------------------------------------
    async def _dispatch(self) -> None:
        while True:
            message = await self.bus.incoming.get()
            try:
                self._handle(message)
            except WireError as exc:
                self.rejected_messages[exc.reason] += 1
                self.log.warning(
                    "message.rejected", topic=message.topic, reason=exc.reason, detail=exc.detail
                )

    def _handle(self, message: Incoming) -> None:
        where = self.topics.parse(message.topic)
        if where.kind == "status" and where.client is not None:
            if message.payload:
                self._on_status(where.client, message.payload)
        elif where.kind == "up" and where.client is not None and where.round is not None:
            self._on_upload(where.round, where.client, message.payload)
        elif where.kind == "metrics" and where.client is not None and where.round is not None:
            self._on_metrics(where.round, where.client, message.payload)

    def _on_status(self, client: str, payload: bytes) -> None:
        state, info, reason = messages.read_status(payload, client)
        record = self.clients.get(client)
        if state == "online" and info is not None:
            self.gate.schema_for(info)  # an announcement the method cannot serve is rejected here
            self.clients[client] = ClientRecord(info)
            self.log.info("client.online", client=client, arch=info.arch, samples=info.num_samples)
        elif record is not None and record.online:
            record.online = False
            self.log.warning("client.offline", client=client, reason=reason, round=self.gate.round)
        self.changed.set()

    def _on_upload(self, t: int, client: str, payload: bytes) -> None:
        record = self.clients.get(client)
        try:
            self.gate.check(t, client, payload, record.info if record else None)
        except RejectedUpload as exc:
            event = "upload.late" if exc.reason == "stale" else "upload.rejected"
            self.log.warning(
                event,
                round=t,
                client=client,
                reason=exc.reason,
                detail=exc.detail,
                bytes=len(payload),
            )
            return
        self.log.debug("upload.accepted", round=t, client=client, bytes=len(payload))
        self.changed.set()

    def _on_metrics(self, t: int, client: str, payload: bytes) -> None:
        message = messages.read_metrics(payload, client)
        seen = self.metrics_seen.setdefault(t, set())
        if client in seen:
            return
        seen.add(client)
        record = {
            "round": t,
            "client_id": client,
            **{k: v for k, v in message.body.items() if isinstance(v, int | float | str | bool)},
        }
        self.journal.append_metrics(record)
        self.records.append(record)
        self.changed.set()

    # --- round loop ---------------------------------------------------------------
    def _live(self) -> list[str]:
        return sorted((c for c, r in self.clients.items() if r.online), key=_order)

    async def _wait(self, predicate: Any, timeout: float) -> bool:
        """Wait until ``predicate()`` holds or ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.changed.clear()
            if predicate():
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=remaining)
            except TimeoutError:
                return bool(predicate())

    async def _publish_state(self, status: str, t: int, **extra: Any) -> None:
        await self.bus.publish(
            self.topics.state,
            messages.round_state(self.config.run_id, status=status, round=t, **extra),
            retain=True,
        )

    async def _run_round(self, t: int) -> None:
        log = self.log.bind(round=t)
        started = time.monotonic()
        for attempt in range(1, self.fed.max_round_attempts + 1):
            if (
                attempt > 1
            ):  # whoever was asked gets a moment to come back (a broker restart drops all)
                await self._wait(
                    lambda: self.gate.selected - set(self.gate.accepted) <= set(self._live()),
                    RETRY_GRACE_S,
                )
            if len(self._live()) < self.fed.min_clients:
                log.warning(
                    "round.waiting",
                    reason="too few live clients",
                    live=len(self._live()),
                    min_clients=self.fed.min_clients,
                    attempt=attempt,
                )
                await self._wait(
                    lambda: len(self._live()) >= self.fed.min_clients, self.fed.round_timeout_s
                )
                if len(self._live()) < self.fed.min_clients:
                    continue
            selected = select_clients(
                self._live(),
                fraction=self.fed.fraction,
                min_clients=self.fed.min_clients,
                seed=self.config.seed,
                t=t,
                attempt=attempt,
            )
            if attempt > 1:  # a retry asks again whoever was asked before and is live
                selected = sorted(
                    set(selected) | (self.gate.selected & set(self._live())), key=_order
                )
            self.gate.open_round(t, selected, keep=attempt > 1)
            deadline = time.time() + self.fed.round_timeout_s
            params = self.server.round_params(t)
            await self._publish_state(
                "open", t, selected=selected, deadline=deadline, params=params, attempt=attempt
            )
            await self.bus.publish(
                self.topics.start(t),
                messages.round_start(
                    self.config.run_id,
                    t,
                    selected=selected,
                    deadline=deadline,
                    params=params,
                    attempt=attempt,
                    uploaded=sorted(self.gate.accepted, key=_order),
                ),
            )
            log.info(
                "round.started",
                selected=selected,
                attempt=attempt,
                deadline_s=self.fed.round_timeout_s,
            )
            connections = self.bus.connections
            await self._wait(
                lambda: all(
                    c in self.gate.accepted or not self.clients[c].online for c in selected
                ),
                self.fed.round_timeout_s,
            )
            await self._settle_after_wills(selected, connections, deadline)
            if len(self.gate.accepted) >= self.fed.min_clients:
                break
            self.retries += 1
            log.warning(
                "round.retried",
                reason="fewer uploads than min_clients",
                uploads=len(self.gate.accepted),
                min_clients=self.fed.min_clients,
                attempt=attempt,
            )
        else:
            raise RunAborted(
                f"round {t}: fewer than min_clients={self.fed.min_clients} uploads after "
                f"{self.fed.max_round_attempts} attempts"
            )
        uploads = self.gate.close_round()
        missing = sorted(self.gate.selected - {u.client_id for u in uploads}, key=_order)
        for client in missing:
            self.missing_uploads += 1
            log.warning("upload.missing", client=client, online=self.clients[client].online)
        downlinks = self.server.aggregate(t, uploads)
        for client, size in self.gate.accepted_bytes.items():
            self.comm["up_bytes"] += size
            self.comm["up_count"] += 1
        payloads = messages.encode_downlinks(self.config.run_id, t, downlinks)
        # Checkpoint before publishing: a crash from here on re-publishes, never re-aggregates.
        # Written to the page cache now (it survives our process dying); the fsync that
        # makes it survive a power cut runs while the downlinks go out.
        await self._synced_checkpoint()
        self._save_checkpoint(t, payloads)
        self._syncing = asyncio.create_task(asyncio.to_thread(self.journal.sync_checkpoint))
        await self._publish_downlinks(t, payloads)
        await self._publish_state("closed", t)
        log.info(
            "round.closed",
            uploads=len(uploads),
            missing=missing,
            seconds=round(time.monotonic() - started, 3),
            **self._progress(t - 1),
        )

    async def _settle_after_wills(
        self, selected: list[str], connections: int, deadline: float
    ) -> None:
        """A broker going down fires every client's last will just before our own link
        drops. If ours drops too, the wills were the broker's doing, not the clients':
        wait for the broker, give the clients a moment to come back, then wait for the
        uploads of those that did until the round's deadline (they may still be training)."""
        gone = [c for c in selected if c not in self.gate.accepted and not self.clients[c].online]
        if not gone:
            return
        await asyncio.sleep(WILL_SETTLE_S)
        if self.bus.connected.is_set() and self.bus.connections == connections:
            return  # they really left
        self.log.warning("round.broker_lost", waiting_for=gone, grace_s=RECONNECT_GRACE_S)
        await self.bus.wait_connected(timeout=self.fed.round_timeout_s)
        await self._wait(
            lambda: all(c in self.gate.accepted or self.clients[c].online for c in gone),
            min(RECONNECT_GRACE_S, max(deadline - time.time(), 0.0)),
        )
        await self._wait(
            lambda: all(c in self.gate.accepted or not self.clients[c].online for c in selected),
            max(deadline - time.time(), 0.0),
        )

    async def _publish_downlinks(
        self, t: int, payloads: messages.DownlinkPayloads, *, count: bool = True
    ) -> None:
        personal, broadcast = payloads.personal, payloads.broadcast
        # Pipelined: one broker round trip for all of them, not one per client.
        await asyncio.gather(
            *(
                self.bus.publish(self.topics.down(t, client), payload)
                for client, payload in personal.items()
            ),
            self.bus.publish(self.topics.down_all(t), broadcast, retain=True),
        )
        if t > 1:  # only the newest broadcast stays retained, for late joiners
            await self.bus.publish(self.topics.down_all(t - 1), b"", retain=True)
        for client in self._live() if count else []:
            self.comm["down_bytes"] += len(broadcast) + len(personal.get(client, b""))
            self.comm["down_count"] += 1

    def _progress(self, t: int) -> dict[str, Any]:
        rows = [r for r in self.records[-4 * max(len(self.clients), 1) :] if r["round"] == t]
        if not rows:
            return {}
        return {
            "evaluated_round": t,
            "mean_accuracy": round(float(np.mean([r["accuracy"] for r in rows])), 4),
            "mean_mae": round(float(np.mean([r["mae"] for r in rows])), 3),
        }

    # --- checkpoint -----------------------------------------------------------------
    def _save_checkpoint(self, t: int, payloads: messages.DownlinkPayloads) -> None:
        self.journal.save_checkpoint(
            {
                "run_id": self.config.run_id,
                "method": self.config.method,
                "round": t,
                "server": self.server.state_dict(),
                "rejections": dict(self.gate.rejections),
                "comm": self.comm,
                "retries": self.retries,
                "missing_uploads": self.missing_uploads,
                "rejected_messages": dict(self.rejected_messages),
                "downlink_payloads": {
                    "broadcast": payloads.broadcast,
                    "personal": payloads.personal,
                },
                "clients": sorted(self.clients, key=_order),
            },
            sync=False,
        )

    async def _synced_checkpoint(self) -> None:
        """Wait for the previous checkpoint's fsync (one at a time; errors surface here)."""
        if self._syncing is not None:
            await self._syncing
            self._syncing = None

    def _restore(self) -> None:
        state = self.journal.load_checkpoint()
        if state is None:
            return
        if state.get("run_id") != self.config.run_id or state.get("method") != self.config.method:
            raise MqttflError(
                f"{self.journal.checkpoint_path} belongs to run {state.get('run_id')!r} "
                f"({state.get('method')}); use another --out"
            )
        self.server.load_state_dict(state["server"])
        self.gate.rejections.update(state["rejections"])
        self.gate.round = int(state["round"])
        self.comm.update(state["comm"])
        self.retries = int(state["retries"])
        self.missing_uploads = int(state["missing_uploads"])
        self.rejected_messages.update(state.get("rejected_messages", {}))
        self.start_round = int(state["round"]) + 1
        saved = state.get("downlink_payloads")
        payloads = messages.DownlinkPayloads(**saved) if saved else None
        self.resume = (payloads, state.get("clients", []))
        self.records = self.journal.read_metrics()
        for record in self.records:
            self.metrics_seen.setdefault(int(record["round"]), set()).add(str(record["client_id"]))
        self.log.info("run.resumed", from_round=self.start_round)

    async def _resume(
        self, t: int, payloads: messages.DownlinkPayloads | None, known: list[str]
    ) -> None:
        """Hear every client known at the checkpoint again (their retained statuses), and
        re-publish round t's downlinks in case the crash came before they all went out."""
        heard = await self._wait(lambda: set(known) <= set(self.clients), RESUME_LISTEN_S)
        self.log.info("clients.rejoined", live=len(self._live()), known=len(known), all_heard=heard)
        if payloads is not None:
            await self._publish_downlinks(t, payloads, count=False)  # clients ignore a copy
            await self._publish_state("closed", t)

    # --- whole run ----------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        self._restore()
        async with asyncio.TaskGroup() as group:
            bus_task = group.create_task(self.bus.run())
            inbox_task = group.create_task(self._dispatch())
            try:
                summary = await self._run_all()
            finally:
                bus_task.cancel()
                inbox_task.cancel()
        return summary

    async def _run_all(self) -> dict[str, Any]:
        await self.bus.wait_connected(timeout=60)
        self.log.info(
            "run.started",
            method=self.config.method,
            rounds=self.config.rounds,
            expected_clients=self.fed.num_clients,
        )
        if self.start_round == 1:
            await self._publish_state("waiting", 0)
            joined = await self._wait(
                lambda: len(self._live()) >= self.fed.num_clients, self.fed.join_timeout_s
            )
            self.log.info(
                "clients.joined",
                live=len(self._live()),
                expected=self.fed.num_clients,
                all_joined=joined,
            )
        elif self.resume is not None:
            await self._resume(self.start_round - 1, *self.resume)
        for t in range(self.start_round, self.config.rounds + 1):
            structlog.contextvars.bind_contextvars(round=t)
            await self._run_round(t)
        last = self.config.rounds
        await self._wait(
            lambda: set(self._live()) <= self.metrics_seen.get(last, set()),
            self.fed.final_metrics_timeout_s,
        )
        await self._synced_checkpoint()
        summary = self.summary()
        self.journal.write_summary(summary)
        await self._publish_state("finished", last)
        self.log.info(
            "run.finished", rounds=last, mean=summary["mean"], rejections=summary["rejections"]
        )
        return summary

    def summary(self) -> dict[str, Any]:
        table = summarize_clients(self.records)
        up_n, down_n = max(self.comm["up_count"], 1), max(self.comm["down_count"], 1)
        return {
            "run_id": self.config.run_id,
            "method": self.config.method,
            "rounds_completed": self.config.rounds,
            "clients": table,
            "mean": mean_over_clients(table),
            "comm": {
                "up_bytes_per_client_round": self.comm["up_bytes"] / up_n,
                "down_bytes_per_client_round": self.comm["down_bytes"] / down_n,
                "up_bytes_total": self.comm["up_bytes"],
                "down_bytes_total": self.comm["down_bytes"],
            },
            "rejections": dict(self.gate.rejections),
            "rejected_messages": dict(self.rejected_messages),
            "retries": self.retries,
            "missing_uploads": self.missing_uploads,
            "config": self.config.model_dump(mode="json"),
        }
