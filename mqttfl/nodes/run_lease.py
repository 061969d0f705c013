"""Before a coordinator takes its run: one coordinator per run, and no finished run reused.

:func:`claim_run` looks at the broker on a connection of its own (never under the
coordinator's client id, which would take a live coordinator's session over) and stops
with one line when the run already has a live coordinator, or when the run id belongs
to a finished run; ``clear`` (``--clear-run``) removes a finished or abandoned run's
retained messages instead, so the run id starts afresh (the command then sets the old
run directory aside). Starting afresh under the same run id is what a locked broker
allows: its ACL names the run id (``broker init --run-id``).

A live lease is a claim, not proof (on an open broker anyone can publish one): the
holder is asked (:func:`holder_answers`), and a lease nobody answers for by the time the
holder's last will would have fired (1.5 keep-alives) is taken over, with one line. A
released lease is asked about as well, briefly: on an open broker a forged one could
otherwise let a second coordinator connect and fight the live one for its session. The
live coordinator's side is :class:`LeaseGuard`: it answers, restores its lease when
something else is published there, and of two coordinators that took each other's
session over, the later one stops.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal, TypeVar

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.probe import clear_retained, read_retained
from mqttfl.bus.transport import Bus
from mqttfl.config import RunConfig
from mqttfl.errors import RunAborted, StateError, WireError
from mqttfl.logs import get_logger
from mqttfl.wire import Topics
from mqttfl.wire.control import RunStatus, read_run_status
from mqttfl.wire.lease import Lease, is_probe, probe, read_lease, taken
from mqttfl.wire.topics import SiteTopic

T = TypeVar("T")
LEASE_GRACE_S = 2.0  # past 1.5 keep-alives (when the broker fires a silent holder's will)
REPROBE_S = 2.0  # ask the holder again this often while waiting
# A released lease is asked about too (anyone can publish one): a live holder answers
# within its lease budget (2 a second, engine/budget.py), so this is ample.
RELEASED_PROBE_S = 1.5
CONTEST_S = 30.0  # a session lost this recently makes another live lease a real rival
Verdict = Literal["ignore", "answer", "restore", "yield"]


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def finished_text(run_id: str, status: RunStatus, broker: BrokerAddress) -> str:
    when = f"at {utc(status.finished_at)}" if status.finished_at is not None else "earlier"
    return (
        f"run {run_id!r} already finished {when} (round {status.round}): the broker {broker} "
        "still holds its final state. To start it again, run `mqttfl coordinator --clear-run` "
        "with the same --out (it clears the run's retained messages and sets the old run "
        "directory aside; the run id stays, so a broker ACL from `broker init --run-id` still "
        "fits), then the clients as before; or give the coordinator and every client a new "
        "run id (--set run_id=NEW), which a locked broker must allow first "
        "(broker init --run-id NEW)"
    )


def my_lease() -> Lease:
    return taken(socket.gethostname(), os.getpid())


async def claim_run(
    config: RunConfig,
    broker: BrokerAddress,
    *,
    credentials: Credentials | None = None,
    clear: bool = False,
) -> None:
    """Raise :class:`MqttflError` (one line) if this coordinator must not run."""
    topics = Topics(config.run_id)
    run = config.run_id
    log = get_logger(run_id=run, client_id="coordinator")
    timeout = config.broker.connect_timeout_s
    who = f"the coordinator of run {run!r}"
    identifier = f"mqttfl-{run}-look"
    held = await read_retained(
        broker,
        [topics.everything] if clear else [topics.lease, topics.state],
        marker_topic=f"{topics.base}/probe",
        credentials=credentials,
        who=who,
        identifier=identifier,
        timeout=timeout,
    )
    lease = _decoded(held.get(topics.lease), read_lease)
    if lease is not None:  # live or released, a retained lease is a claim: ask its holder
        wait_s = will_window(config) if lease.live else RELEASED_PROBE_S
        answer = await holder_answers(
            config, broker, credentials=credentials, wait_s=wait_s, holder=lease
        )
        if answer is not None:
            raise StateError(
                f"run {run!r} already has a live coordinator ({answer.describe()}) on {broker}: "
                "a run has one coordinator. Stop that one first (a restarted one resumes "
                "from its --out), or give this run a new id (--set run_id=NEW)"
            )
        if lease.live:
            log.warning(
                "lease.taken_over",
                holder=lease.describe(),
                waited_s=round(wait_s, 1),
                note="the run's lease said live, but its holder did not answer before its "
                "last will would have fired: a stale or forged lease, taken over",
            )
    status = _decoded(held.get(topics.state), lambda raw: read_run_status(raw, run_id=run))
    finished = status is not None and status.phase == "finished"
    if finished and not clear:
        assert status is not None
        raise StateError(finished_text(run, status, broker))
    # A site's notice belongs to its bridge (the only identity `broker init` lets write it),
    # which publishes it again whenever it connects: it is left as it is.
    cleared = sorted(topic for topic in held if not _is_site(topics, topic))
    if clear and cleared:
        await clear_retained(
            broker,
            cleared,
            credentials=credentials,
            who=who,
            identifier=identifier,
            timeout=timeout,
        )
        log.warning("run.cleared", retained_topics=len(cleared), finished=finished)


def _is_site(topics: Topics, topic: str) -> bool:
    try:
        return isinstance(topics.parse(topic), SiteTopic)
    except WireError:
        return False


def _decoded(raw: bytes | None, read: Callable[[bytes], T]) -> T | None:
    if raw is None:
        return None
    try:
        return read(raw)
    except WireError:
        return None  # not ours to judge here: the run's own readers reject it with a reason


def will_window(config: RunConfig) -> float:
    """How long a silent lease holder gets: its last will fires after 1.5 keep-alives."""
    return 1.5 * config.broker.keepalive_s + LEASE_GRACE_S


async def holder_answers(
    config: RunConfig,
    broker: BrokerAddress,
    *,
    credentials: Credentials | None,
    wait_s: float,
    holder: Lease,
) -> Lease | None:
    """Ask whether the run has a live coordinator: a probe on the lease topic (not
    retained), again every :data:`REPROBE_S`. Returns the live lease published in answer;
    None when ``holder``'s own released lease arrives (its last will), or nothing within
    ``wait_s``. Anyone else's released lease is no answer: a flood of forged ones must
    not pass for the holder's will."""
    topics = Topics(config.run_id)
    token = secrets.token_hex(8)
    question = probe(token)
    timeout = config.broker.connect_timeout_s
    bus = Bus(
        broker,
        identifier=f"mqttfl-{config.run_id}-look-{token[:6]}",
        subscriptions=[topics.lease],
        credentials=credentials,
        who=f"the coordinator of run {config.run_id!r}",
        connect_timeout_s=timeout,
        events="lookup",
    )
    gone = Lease(False, holder.host, holder.pid, holder.since) if holder.live else None

    async def ask() -> Lease | None:
        await bus.wait_connected(timeout=timeout)
        loop = asyncio.get_running_loop()
        deadline, asked = loop.time() + wait_s, -math.inf
        while (now := loop.time()) < deadline:
            if now - asked >= REPROBE_S:
                await bus.publish(topics.lease, question, timeout=timeout)
                asked = now
            left = min(deadline, asked + REPROBE_S) - loop.time()
            try:
                message = await asyncio.wait_for(bus.incoming.get(), timeout=max(left, 0.01))
            except TimeoutError:
                continue
            if message.retained or message.payload == question:
                continue
            answer = _decoded(message.payload, read_lease)
            if answer is not None and answer.live:
                return answer
            if answer is not None and answer == gone:
                return None
        return None

    async with asyncio.TaskGroup() as group:
        running = group.create_task(bus.run())
        try:
            return await ask()
        finally:
            running.cancel()


class LeaseGuard:
    """The live coordinator's side of its lease: what a message on the lease topic means.

    Its own lease: nothing. A probe: answer (publish the lease again). Anything else (a
    released or forged lease, an empty one that cleared it): restore the lease. Another
    coordinator's live lease, older than ours, while our session was lost within
    :data:`CONTEST_S` (it took our session over, and we took it back): we are the second
    coordinator of the run, and we stop.
    """

    def __init__(self, own: Lease, clock: Callable[[], float]) -> None:
        self.own, self.clock = own, clock
        self.mine = own.encode()
        self.lost_at = -math.inf
        self.restored = 0
        self.releasing = False  # giving the lease up: what we publish then is not an attack

    def judge(self, raw: bytes) -> Verdict:
        if self.releasing or raw == self.mine:
            return "ignore"
        if is_probe(raw):
            return "answer"
        if self.rival(raw) is not None:
            return "yield"
        self.restored += 1
        return "restore"

    def rival(self, raw: bytes) -> Lease | None:
        other = _decoded(raw, read_lease)
        mine = (self.own.host, self.own.pid)
        if other is None or not other.live or (other.host, other.pid) == mine:
            return None
        if other.order() < self.own.order() and self.clock() - self.lost_at < CONTEST_S:
            return other
        return None

    def yielded(self, run: str, raw: bytes) -> RunAborted:
        other = self.rival(raw)
        holder = other.describe() if other is not None else "another process"
        self.releasing = True  # our release would overwrite the first coordinator's lease
        return RunAborted(
            f"run {run!r} already has a live coordinator ({holder}), which took this one's "
            f"MQTT session over: a run has one coordinator, so this one ({self.own.describe()}) "
            "stops"
        )
