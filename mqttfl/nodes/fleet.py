"""`mqttfl fleet`: many client runners in one process and one event loop.

A lab machine that simulates hundreds of devices cannot afford one Python process (and
one torch import, about 300 MB) per device. A fleet runs many :class:`ClientRunner`\\ s
side by side; each keeps everything a device has, so to the broker and the coordinator
it is indistinguishable from a separate device:

- its own MQTT session (its own :class:`~mqttfl.bus.transport.Bus`, client
  identifier, retained ``online`` birth status and ``offline`` last will) and, with a
  broker that has a password per identity, its own credentials (``--credentials-dir``
  holding ``<id>.env`` files as `mqttfl broker init` writes them);
- its own shard, model, optimizer, method state and state file.

A runner's windows are spilled to an unnamed file in the state folder and mapped back
(:mod:`mqttfl.data.spill`); their pages are handed back after each of its passes, so the
clients that sit a round out hold their models but none of their windows. Every thread
of the process allocates from one heap arena, so the workers do not each keep the
high-water mark of the passes they ran.

What the runners share is read-only or free: the imported modules (torch above all),
the frozen run config, and a small worker pool through which all training and
evaluation go (one thread per core, torch with one thread each), so the runners take
turns on the cores instead of fighting for them while the event loop keeps every
session alive.

A runner that fails (an exception out of it) is logged and stops alone; if it had
announced itself, it says ``offline`` first, so the coordinator does not wait for it. A
runner the broker refuses (its login, or a publish its ACL denies) stops the whole
fleet instead, every other runner saying ``offline``, with that refusal as the command's
one line (exit 2), as `mqttfl client` would: a mistake of the setup, which no runner gets
past by retrying.
Killing the whole process is a mass dropout: the broker fires every runner's last
will, as when a site loses power.

The top of this module (id lists, credentials) imports no torch: `mqttfl run` uses it
to plan its fleets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.refusal import Refused
from mqttfl.bus.transport import Bus
from mqttfl.config import RunConfig
from mqttfl.errors import BrokerError, MqttflError, UsageError, first_mqttfl_error
from mqttfl.logs import get_logger
from mqttfl.provisioning.broker_init import read_env_file
from mqttfl.wire import check_id
from mqttfl.wire.control import COORDINATOR, Offline
from mqttfl.wire.ids import is_numeric_id

if TYPE_CHECKING:
    from mqttfl.data.shard import Shard
    from mqttfl.nodes.client import ClientRunner

P = ParamSpec("P")
R = TypeVar("R")

MAX_IDS = 10_000  # as federation.num_clients
GOODBYE_TIMEOUT_S = 10.0


# --- which clients ---------------------------------------------------------------------
def parse_ids(text: str) -> list[str]:
    """``0-9,12,20-29`` -> ``['0', ..., '9', '12', '20', ..., '29']``, in the order given.

    An item ``a-b`` whose ends are numbers is an inclusive range (``007-010`` keeps the
    width of zero-padded ends); any other item is one id, so names with a dash
    (``room-a``) stay whole. Empty items, reversed ranges, duplicates and ids that cannot
    be a topic level are errors that name the item.
    """
    ids: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise UsageError(f"--ids {text!r}: an empty item (write e.g. 0-9,12,20-29)")
        low, dash, high = item.partition("-")
        if dash and (is_numeric_id(low) or not low or not high):
            ids += _expand(item, low, high, room=MAX_IDS - len(ids))
        else:
            try:
                ids.append(check_id(item))
            except MqttflError as exc:
                raise UsageError(f"--ids: {exc}") from None
        if len(ids) > MAX_IDS:
            raise UsageError(f"--ids: more than {MAX_IDS} clients")
    seen: set[str] = set()
    for client in ids:
        if client in seen:
            raise UsageError(f"--ids {text!r}: client {client!r} is listed twice")
        if client == COORDINATOR:
            raise UsageError(f"--ids: '{COORDINATOR}' is the coordinator's identity")
        seen.add(client)
    return ids


def _expand(item: str, low: str, high: str, *, room: int) -> list[str]:
    if not (is_numeric_id(low) and is_numeric_id(high)):
        raise UsageError(f"--ids: {item!r} is not a range of two numbers, like 20-29")
    first, last = int(low), int(high)
    if last < first:
        raise UsageError(f"--ids: the range {item!r} runs backwards")
    if last - first + 1 > room:
        raise UsageError(f"--ids: more than {MAX_IDS} clients")
    width = len(low) if len(low) > 1 and low.startswith("0") else 0
    if width and len(high) != width:
        raise UsageError(f"--ids: the zero-padded range {item!r} needs ends of equal width")
    return [f"{n:0{width}d}" if width else str(n) for n in range(first, last + 1)]


def format_ids(ids: Sequence[str]) -> str:
    """The inverse of :func:`parse_ids`: runs of consecutive numbers become ``a-b``."""
    items: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            items.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run.clear()

    for client in ids:
        canonical = is_numeric_id(client) and str(int(client)) == client
        if canonical and run and int(client) == run[-1] + 1:
            run.append(int(client))
            continue
        flush()
        if canonical:
            run.append(int(client))
        else:
            items.append(client)
    flush()
    return ",".join(items)


def split_ids(ids: Sequence[str], parts: int) -> list[list[str]]:
    """``ids`` in ``parts`` contiguous blocks whose sizes differ by at most one."""
    if not 1 <= parts <= len(ids):
        raise UsageError(f"cannot place {len(ids)} clients in {parts} fleets")
    size, extra = divmod(len(ids), parts)
    blocks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        blocks.append(list(ids[start:end]))
        start = end
    return blocks


def log_name(ids: Sequence[str]) -> str:
    """The fleet's log file (``fleet-0-199``): one JSON-lines file per process."""
    return f"fleet-{ids[0]}" if len(ids) == 1 else f"fleet-{ids[0]}-{ids[-1]}"


def check_ids(config: RunConfig, ids: Sequence[str]) -> None:
    """Refuse, before anything starts, ids that the config's data source cannot serve."""
    from mqttfl.data.sources import client_id_problem

    for client in ids:
        problem = client_id_problem(config.data, client, num_clients=config.federation.num_clients)
        if problem is not None:
            raise UsageError(f"--ids: {problem}")


def runner_credentials(
    base: Credentials, ids: Sequence[str], directory: Path | None
) -> dict[str, Credentials]:
    """Each runner's credentials: ``directory/<id>.env`` over ``base`` (the config's and
    the environment's); ``base`` alone for every runner without a directory."""
    if directory is None:
        return dict.fromkeys(ids, base)
    if not directory.is_dir():
        raise UsageError(f"--credentials-dir {directory} is not a directory")
    missing = [client for client in ids if not (directory / f"{client}.env").is_file()]
    if missing:
        raise UsageError(
            f"--credentials-dir {directory}: no {missing[0]}.env "
            f"({len(missing)} of the {len(ids)} clients have none; `mqttfl broker init` "
            "writes one per identity)"
        )
    found = {}
    for client in ids:
        env = read_env_file(directory / f"{client}.env")
        found[client] = dataclasses.replace(
            base,
            username=env.get("MQTTFL_BROKER__USERNAME", base.username),
            password=env.get("MQTTFL_BROKER__PASSWORD", base.password),
            tls_ca=env.get("MQTTFL_BROKER__TLS_CA", base.tls_ca),
            tls_cert=env.get("MQTTFL_BROKER__TLS_CERT", base.tls_cert),
            tls_key=env.get("MQTTFL_BROKER__TLS_KEY", base.tls_key),
        )
    return found


def default_workers() -> int:
    return os.cpu_count() or 1


# --- running them ----------------------------------------------------------------------
class Fleet:
    """The runners of ``ids`` in this process: :meth:`build` them, then :meth:`run`."""

    def __init__(
        self,
        config: RunConfig,
        broker: BrokerAddress,
        ids: Sequence[str],
        *,
        state_dir: Path,
        credentials: Mapping[str, Credentials],
        workers: int | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise UsageError(f"--workers {workers}: at least one worker is needed")
        self.config = config
        self.broker = broker
        self.ids = list(ids)
        self.state_dir = state_dir
        self.credentials = credentials
        self.workers = workers or default_workers()
        from mqttfl.training.memory import one_arena

        one_arena()  # before the pool's threads start: one heap for every runner's passes
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="mqttfl-fleet")
        self.runners: dict[str, ClientRunner] = {}
        self.failed: dict[str, str] = {}  # client -> what stopped it
        self.log = get_logger(run_id=config.run_id, client_id="fleet")

    def build(self) -> None:
        """Load each shard and build each runner, one at a time: a runner seeds torch's
        global generator and builds its model at once (identical initial weights per
        architecture), so no two builds may interleave. A client whose shard or state
        file cannot be read is logged as failed; the others go on."""
        import torch

        from mqttfl.data.sources import run_client_shard
        from mqttfl.data.spill import spill
        from mqttfl.nodes.client import ClientRunner

        windows = self.state_dir / self.config.run_id
        for client in self.ids:
            try:
                windows.mkdir(parents=True, exist_ok=True)
                shard = spill(run_client_shard(self.config, client), windows)
                self.runners[client] = ClientRunner(
                    self.config,
                    client,
                    self.broker,
                    shard,
                    state_dir=self.state_dir,
                    credentials=self.credentials.get(client),
                    executor=Releasing(self.pool, shard),
                )
            except Exception as exc:  # one bad shard or state file never stops the fleet
                self._failed(client, exc, stage="start")
        # Each runner set torch's (process-wide) thread count; the pool is the parallelism.
        torch.set_num_threads(1)

    async def run(self) -> dict[str, str]:
        """Run every built runner to its end; return the ones that failed, with why.
        Raise :class:`Refused` (in a task group's exception group) when the broker
        refused one: the others are stopped then."""
        self.log.info(
            "fleet.started",
            clients=len(self.runners),
            failed=len(self.failed),
            workers=self.workers,
            pid=os.getpid(),
        )
        try:
            async with asyncio.TaskGroup() as group:
                for client, runner in self.runners.items():
                    group.create_task(self._run_one(runner), name=f"client-{client}")
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.log.info(
            "fleet.finished",
            clients=len(self.ids),
            failed=sorted(self.failed),
        )
        return dict(self.failed)

    async def _run_one(self, runner: ClientRunner) -> None:
        """One runner, in a task of its own (so its bound log context is its own)."""
        try:
            await runner.run()
        except Exception as exc:
            refusal = first_mqttfl_error(exc, prefer=Refused)
            if isinstance(refusal, Refused):
                self.log.warning(
                    "fleet.client_refused", client=runner.client_id, error=str(refusal)
                )
                raise Refused(str(refusal)) from None  # the task group stops the others
            reason = self._failed(runner.client_id, exc, stage="run")
            await self._say_offline(runner, reason)

    def _failed(self, client: str, exc: BaseException, *, stage: str) -> str:
        reason = _describe(exc)
        self.failed[client] = reason
        self.log.error("fleet.client_failed", client=client, stage=stage, error=reason)
        return reason

    async def _say_offline(self, runner: ClientRunner, reason: str) -> None:
        """Tell the coordinator that a runner which had announced itself is gone.

        Its own session may have ended with a clean DISCONNECT (no last will), and its
        own ``offline`` may not have gone out; so say it again on a short session of the
        runner's own identity (the retained status of a client is one message: saying
        it twice is harmless).
        """
        if runner.bus.connections == 0:
            return  # it never announced itself
        client, bus = runner.client_id, runner.bus
        goodbye = Bus(
            bus.address,
            identifier=bus.identifier,
            subscriptions=[],
            credentials=bus.credentials,
            keepalive_s=bus.keepalive_s,
            connect_timeout_s=bus.connect_timeout_s,
        )
        offline = Offline(client, f"failed: {reason}"[:200]).encode(self.config.run_id)
        task = asyncio.create_task(goodbye.run())
        try:
            await goodbye.wait_connected(timeout=GOODBYE_TIMEOUT_S)
            await goodbye.publish(
                runner.topics.status(client), offline, retain=True, timeout=GOODBYE_TIMEOUT_S
            )
            self.log.info("fleet.client_offline", client=client)
        except BrokerError as exc:
            self.log.warning("fleet.offline_failed", client=client, error=str(exc))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class Releasing(Executor):
    """A runner's view of the fleet's pool: each of its passes, once done, hands its
    shard's window pages back (:func:`mqttfl.data.spill.release`)."""

    def __init__(self, pool: Executor, shard: Shard) -> None:
        self.pool = pool
        self.shard = shard

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        return self.pool.submit(self._then_release, fn, *args, **kwargs)

    def _then_release(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        from mqttfl.data.spill import release

        try:
            return fn(*args, **kwargs)
        finally:
            release(self.shard)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The pool is the fleet's: it shuts it down, not a runner."""


def _describe(exc: BaseException) -> str:
    """``RuntimeError: boom``; the leaves of an exception group, joined."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(leaf) for leaf in exc.exceptions)[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def run_fleet(
    config: RunConfig,
    broker: BrokerAddress,
    ids: Sequence[str],
    *,
    state_dir: Path,
    credentials: Mapping[str, Credentials],
    workers: int | None = None,
) -> dict[str, str]:
    """Build and run a fleet in a new event loop; the clients that failed, with why."""
    fleet = Fleet(
        config, broker, ids, state_dir=state_dir, credentials=credentials, workers=workers
    )

    async def main() -> dict[str, str]:
        fleet.build()
        return await fleet.run()

    return asyncio.run(main())
