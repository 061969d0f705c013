"""Before a coordinator takes its run: one coordinator per run, and no finished run reused.

:func:`claim_run` looks at the broker on a connection of its own (never under the
coordinator's client id, which would take a live coordinator's session over) and stops
with one line when the run already has a live coordinator, or when the run id belongs
to a finished run; ``clear`` (``--clear-run``) first removes a finished or abandoned
run's retained messages, so the run id starts afresh.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.probe import clear_retained, read_retained
from mqttfl.config import RunConfig
from mqttfl.errors import MqttflError, WireError
from mqttfl.logs import get_logger
from mqttfl.wire import Topics
from mqttfl.wire.control import RunStatus, read_run_status
from mqttfl.wire.lease import Lease, read_lease, taken

T = TypeVar("T")


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def finished_text(run_id: str, status: RunStatus, broker: BrokerAddress) -> str:
    when = f"at {utc(status.finished_at)}" if status.finished_at is not None else "earlier"
    return (
        f"run {run_id!r} already finished {when} (round {status.round}): the broker {broker} "
        "still holds its final state. To run again, give the coordinator and every client "
        "a new run id (--set run_id=NEW), or start the coordinator with --clear-run "
        "(and a new --out) to clear that run's retained messages"
    )


def my_lease() -> Lease:
    return taken(socket.gethostname(), os.getpid())


async def claim_run(
    config: RunConfig,
    broker: BrokerAddress,
    out_dir: Path,
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
    if lease is not None and lease.live:
        raise MqttflError(
            f"run {run!r} already has a live coordinator ({lease.describe()}) on {broker}: "
            "a run has one coordinator. Stop that one first (a restarted one resumes "
            "from its --out), or give this run a new id (--set run_id=NEW)"
        )
    status = _decoded(held.get(topics.state), lambda raw: read_run_status(raw, run_id=run))
    finished = status is not None and status.phase == "finished"
    summary = out_dir / "summary.json"
    if finished and not clear:
        assert status is not None
        raise MqttflError(finished_text(run, status, broker))
    if clear and summary.exists():
        raise MqttflError(
            f"--clear-run: --out {out_dir} holds a finished run ({summary}); "
            "give the fresh run a new --out"
        )
    if clear and held:
        await clear_retained(
            broker,
            sorted(held),
            credentials=credentials,
            who=who,
            identifier=identifier,
            timeout=timeout,
        )
        log.warning("run.cleared", retained_topics=len(held), finished=finished)


def _decoded(raw: bytes | None, read: Callable[[bytes], T]) -> T | None:
    if raw is None:
        return None
    try:
        return read(raw)
    except WireError:
        return None  # not ours to judge here: the run's own readers reject it with a reason
