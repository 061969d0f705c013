"""The Local reference of `mqttfl run`: what each client reaches when it trains alone.

A federated table says what each client reached, not what federation bought it. So
`mqttfl run` shows, beside each client's accuracy, the same client's accuracy in a Local
run (method ``local``, FedAPA Table III's lower bound) of the same config, and the
difference (``gain``). The reference is what ``mqttfl run --set method=local`` reports
when every client answers every round, computed without a broker: a Local client never
hears from the others, so the clients train here, in this process, side by side in
worker threads (as a fleet trains its clients). Each is built and trained by the code a
Local client runs (:mod:`mqttfl.nodes.device`: the same shard, architecture, initial
weights and ``[train]`` recipe, the same per-round batch order), trains in the rounds the
coordinator would select it for (:func:`~mqttfl.engine.selection.select_clients`, first
attempts), is evaluated on its test split after each of the last five rounds (the
others are never scored), and is scored like the run's summary: each metric's mean over
those rounds
(:func:`~mqttfl.engine.journal.summarize_clients`).

It is trained once and then cached, in ``$MQTTFL_CACHE_DIR`` (else
``$XDG_CACHE_HOME/mqttfl``, else ``~/.cache/mqttfl``) under ``local-reference/<key>.json``.
The key is a SHA-256 over everything that decides the result (:func:`reference_key`):
the ``[data]``, ``[model]`` and ``[train]`` tables, ``rounds``, ``seed``, the
federation's ``num_clients``, ``fraction`` and ``min_clients`` (which clients train in
which round), a digest of each client's shard arrays, the source of the modules that
build, select and train a Local client (every package file its code path imports, from
the import graph: :func:`code_files`), and the numpy and torch versions. Not in
it: the method and its parameters, the broker, the run id, logging. So a second run of
the same federation, with any method, reuses the reference; a new seed, shard or
model trains a new one.

Torch is imported only when a reference is trained; a cached one needs none.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttfl.engine.documents import (
    Gains,
    LocalReferenceBlock,
    MetricsLine,
    RunSummary,
    Scores,
    summary_bytes,
)
from mqttfl.engine.journal import LAST_ROUNDS, summarize_clients
from mqttfl.evaluation.imports import import_closure
from mqttfl.files import write_atomic
from mqttfl.logs import get_logger
from mqttfl.paths import cache_root
from mqttfl.wire.ids import client_order

if TYPE_CHECKING:
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard

#: ``progress(clients, rounds)``: a context manager yielding ``advance(client, round)``
ProgressFactory = Callable[[int, int], AbstractContextManager[Callable[[str, int], None]]]

#: bump when the cached file or the meaning of the reference changes
REFERENCE_FORMAT = 1
#: the module whose code path decides what a Local client learns: every package file it
#: imports (:func:`~mqttfl.evaluation.imports.import_closure`) is part of the key (the
#: data's own files are covered by the shard digests)
CODE_ROOT = "mqttfl.evaluation.reference"
METRICS = ("accuracy", "f1", "mae")
WHAT = (
    "method local (every client trains alone) on the same shards, model, initial weights, "
    f"[train] recipe, rounds and round selection; means over the last {LAST_ROUNDS} rounds"
)


@dataclass(frozen=True)
class LocalReference:
    clients: dict[str, dict[str, float]]  # client id -> accuracy, f1, mae
    key: str
    source: str  # "trained" (now) or "cached"
    path: Path | None  # the cache file; None if it could not be written
    seconds: float  # how long training took (then, for a cached one)

    @property
    def mean(self) -> dict[str, float]:
        return mean_scores(self.clients)


def mean_scores(clients: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each metric's mean over the clients (zeros for none)."""
    rows = list(clients.values())
    return {k: float(np.mean([row[k] for row in rows])) if rows else 0.0 for k in METRICS}


# --- the key --------------------------------------------------------------------------------
def determining_config(config: RunConfig) -> dict[str, Any]:
    """The parts of a run config that decide a Local run's result."""
    recorded = config.recorded()
    federation = recorded["federation"]
    return {
        "data": recorded["data"],
        "model": recorded["model"],
        "train": recorded["train"],
        "rounds": config.rounds,
        "seed": config.seed,
        "federation": {k: federation[k] for k in ("num_clients", "fraction", "min_clients")},
    }


def shard_digest(shard: Shard) -> str:
    digest = hashlib.sha256()
    for array in (shard.x_train, shard.y_train, shard.x_test, shard.y_test):
        contiguous = np.ascontiguousarray(array)
        digest.update(f"{contiguous.dtype.str}{contiguous.shape}".encode())
        digest.update(contiguous.tobytes())
    return digest.hexdigest()


def code_files(package: Path | None = None) -> list[Path]:
    """The package's source files that a Local reference's code path imports."""
    package = package or Path(__file__).resolve().parents[1]
    return import_closure(CODE_ROOT, package)


def code_digest(package: Path | None = None) -> str:
    package = package or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for file in code_files(package):
        digest.update(file.relative_to(package).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def reference_key(config: RunConfig, shards: Mapping[str, Shard]) -> tuple[str, dict[str, Any]]:
    """The cache key of a config's Local reference, and the document it hashes."""
    keyed = {
        "format": REFERENCE_FORMAT,
        "config": determining_config(config),
        "shards": {cid: shard_digest(shard) for cid, shard in shards.items()},
        "code": code_digest(),
        "versions": {"numpy": np.__version__, "torch": _version("torch")},
    }
    text = json.dumps(keyed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), keyed


# --- training ---------------------------------------------------------------------------
def train_local_reference(
    config: RunConfig,
    shards: Mapping[str, Shard],
    *,
    workers: int | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Per client: accuracy, F1 and MAE of a Local run of ``config`` over ``shards``
    (means over the last five rounds). Pure: no broker, no files. ``progress(client,
    round)`` is called (from one thread) after each client-round. A process per client
    where processes can fork; in threads with ``workers`` (or where they cannot)."""
    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.config import PrivacyConfig
    from mqttfl.engine.selection import select_clients

    # Local uploads nothing, so [privacy] has nothing to protect in it (and no mechanism)
    local = config.model_copy(update={"method": "local", "privacy": PrivacyConfig()})
    algorithm = get_algorithm("local")
    ctx = make_context(local)
    server = algorithm.server(ctx)
    ids = sorted(shards, key=client_order)
    fed = config.federation
    rounds = range(1, config.rounds + 1)
    selected = {
        t: select_clients(
            ids,
            fraction=fed.fraction,
            min_clients=fed.min_clients,
            seed=config.seed,
            t=t,
            attempt=1,
        )
        for t in rounds
    }
    params = {t: server.round_params(t) for t in rounds}
    plan = _Plan(local, shards, ids, selected, params)
    if workers is None and "fork" in multiprocessing.get_all_start_methods():
        records = _train_in_processes(plan, progress)
    else:
        records = _train_in_threads(plan, workers or len(ids), progress)
    return {
        cid: {"accuracy": row.accuracy, "f1": row.f1, "mae": row.mae}
        for cid, row in summarize_clients(records).items()
    }


@dataclass(frozen=True)
class _Plan:
    """What every client of a Local reference does, round by round."""

    config: RunConfig  # method local
    shards: Mapping[str, Shard]
    ids: list[str]
    selected: dict[int, list[str]]
    params: dict[int, dict[str, Any]]


def _run_client(
    plan: _Plan,
    cid: str,
    done: Callable[[int], None],
    *,
    stop: threading.Event | None = None,
    build_lock: threading.Lock | None = None,
) -> list[MetricsLine]:
    """One client's Local run: train in the rounds it is selected for, score the last
    ``LAST_ROUNDS``; ``done(t)`` after each round. A build seeds torch's global
    generator (identical initial weights): builds in one process hold ``build_lock``."""
    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.nodes.device import build_client_side, round_rng
    from mqttfl.training.metrics import classification_report

    config, shard = plan.config, plan.shards[cid]
    algorithm = get_algorithm("local")
    with build_lock or nullcontext():
        side = build_client_side(config, algorithm, make_context(config), cid, shard)
    records = []
    for t in range(1, config.rounds + 1):
        if stop is not None and stop.is_set():
            break
        if cid in plan.selected[t]:
            side.train(t, dict(plan.params[t]), round_rng(config.seed, side.info, t))
        side.receive(t, {}, None)
        # only the last rounds are scored: evaluating the others changes nothing
        if t > config.rounds - LAST_ROUNDS:
            report = classification_report(shard.y_test, side.predict(shard.x_test))
            records.append(MetricsLine.model_validate({"client_id": cid, "round": t, **report}))
        done(t)
    return records


# The plan and the progress counters of a reference being trained in processes: set
# before the workers fork, so they inherit them instead of receiving pickles.
_FORKED: dict[str, Any] = {}


def _process_client(index: int) -> list[MetricsLine]:
    import torch

    plan: _Plan = _FORKED["plan"]
    counters = _FORKED["counters"]
    torch.set_num_threads(plan.config.train.torch_threads)  # as each client process sets it

    def done(t: int) -> None:
        counters[index] = t

    return _run_client(plan, plan.ids[index], done)


def reference_processes(clients: int) -> int:
    """How many clients of a Local reference train at once, a forked process each: every
    one up to twice the cores (at least 8), so the default job's six train side by side as
    its federation's do; beyond that they queue. A process per client of 200 once held
    65 GB of summed RSS (each its own activations) and the OOM killer ended the reference."""
    return min(clients, max(8, 2 * (os.cpu_count() or 1)))  # as fleet.default_workers counts


def _train_in_processes(
    plan: _Plan, progress: Callable[[str, int], None] | None
) -> list[MetricsLine]:
    """Processes, as the federation has (at most :func:`reference_processes` at once):
    threads of one process share its GIL, and beside other work the scheduler preempts
    the one holding it while the others wait (docs/benchmarks/sessions.md, "The default job's time": twice the
    slowdown of the federation's processes). Forked, so the shards are inherited, not
    copied through a pipe."""
    # Imported once here, so every child inherits it.
    import torch  # noqa: F401

    context = multiprocessing.get_context("fork")
    counters = context.Array("i", len(plan.ids), lock=False)
    _FORKED.update(plan=plan, counters=counters)
    reported = dict.fromkeys(plan.ids, 0)
    gc.collect()
    gc.freeze()  # what is imported now: a child's collections leave its pages shared
    try:
        with ProcessPoolExecutor(reference_processes(len(plan.ids)), mp_context=context) as pool:
            futures = [pool.submit(_process_client, i) for i in range(len(plan.ids))]
            while True:
                finished, _ = wait(futures, timeout=0.2)
                if progress is not None:
                    for index, cid in enumerate(plan.ids):
                        for t in range(reported[cid] + 1, counters[index] + 1):
                            progress(cid, t)
                        reported[cid] = max(reported[cid], counters[index])
                if len(finished) == len(futures):
                    break
            return [r for future in futures for r in future.result()]
    finally:
        gc.unfreeze()
        _FORKED.clear()


def _train_in_threads(
    plan: _Plan, workers: int, progress: Callable[[str, int], None] | None
) -> list[MetricsLine]:
    import torch

    stop = threading.Event()  # set when the caller gives up (Ctrl-C): end after the round
    previous = torch.get_num_threads()
    torch.set_num_threads(plan.config.train.torch_threads)  # as each client process sets it
    lock = threading.Lock()
    report = threading.Lock()

    def run(cid: str) -> list[MetricsLine]:
        def done(t: int) -> None:
            if progress is not None:
                with report:
                    progress(cid, t)

        return _run_client(plan, cid, done, stop=stop, build_lock=lock)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="mqttfl-reference")
    try:
        return [r for rs in pool.map(run, plan.ids) for r in rs]
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(previous)


# --- the cache --------------------------------------------------------------------------
def _read_cached(path: Path, key: str) -> dict[str, Any] | None:
    try:
        cached = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        get_logger().warning("reference.unreadable", path=str(path), error=str(exc)[:200])
        return None
    if (
        not isinstance(cached, dict)
        or cached.get("key") != key
        or cached.get("format") != REFERENCE_FORMAT
    ):
        return None
    return cached


def local_reference(
    config: RunConfig,
    *,
    cache_dir: Path | None = None,
    shards: Mapping[str, Shard] | None = None,
    progress: ProgressFactory | None = None,
) -> LocalReference:
    """The Local reference of ``config``: from the cache if it holds one with this key,
    else trained now (and cached). ``shards`` default to the clients' own, as `mqttfl run`
    loads them."""
    log = get_logger(run_id=config.run_id, client_id="launcher")
    if shards is None:
        from mqttfl.evaluation.pooled import client_shards

        shards = client_shards(config)
    key, keyed = reference_key(config, shards)
    path = (cache_dir or cache_root()) / "local-reference" / f"{key}.json"
    cached = _cached_reference(path, key)
    if cached is not None:
        log.info("reference.cached", path=str(path), key=key[:16])
        return cached
    log.info(
        "reference.training",
        clients=len(shards),
        rounds=config.rounds,
        hint="--no-local-reference skips it",
    )
    began = time.monotonic()
    if progress is None:
        clients = train_local_reference(config, shards)
    else:
        with progress(len(shards), config.rounds) as advance:
            clients = train_local_reference(config, shards, progress=advance)
    seconds = round(time.monotonic() - began, 1)
    record = {
        "format": REFERENCE_FORMAT,
        "key": key,
        "keyed": keyed,
        "what": WHAT,
        "trained_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "clients": clients,
        "mean": mean_scores(clients),
    }
    stored: Path | None = path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    except OSError as exc:
        log.warning("reference.not_cached", path=str(path), error=exc.strerror or str(exc))
        stored = None
    log.info("reference.trained", seconds=seconds, path=str(stored), key=key[:16])
    return LocalReference(clients, key, "trained", stored, seconds)


def cached_local_reference(
    config: RunConfig, *, cache_dir: Path | None = None
) -> LocalReference | None:
    """The Local reference of ``config`` if the cache holds one, else None (never trains)."""
    from mqttfl.evaluation.pooled import client_shards

    shards = client_shards(config)
    key, _ = reference_key(config, shards)
    path = (cache_dir or cache_root()) / "local-reference" / f"{key}.json"
    return _cached_reference(path, key)


def _cached_reference(path: Path, key: str) -> LocalReference | None:
    """The reference cached at ``path`` under ``key``, or None."""
    cached = _read_cached(path, key)
    if cached is None:
        return None
    return LocalReference(
        {cid: dict(row) for cid, row in cached["clients"].items()},
        key,
        "cached",
        path,
        float(cached["seconds"]),
    )


# --- into the run's summary -----------------------------------------------------------------
def with_reference(summary: RunSummary, reference: LocalReference) -> RunSummary:
    """``summary`` with a ``local_reference`` block: the reference's per-client and mean
    metrics, where it came from, and the gain (the run's accuracy minus the reference's)
    per client and as the mean over the clients both have."""
    gains = {
        cid: row.accuracy - reference.clients[cid]["accuracy"]
        for cid, row in summary.clients.items()
        if cid in reference.clients
    }
    block = LocalReferenceBlock(
        what=WHAT,
        source=reference.source,
        cache=None if reference.path is None else str(reference.path),
        key=reference.key,
        seconds=float(reference.seconds),
        clients={cid: Scores.model_validate(row) for cid, row in reference.clients.items()},
        mean=Scores.model_validate(reference.mean),
        gain=Gains(clients=gains, mean=float(np.mean(list(gains.values()))) if gains else None),
    )
    return summary.model_copy(update={"local_reference": block})


def add_local_reference(
    config: RunConfig,
    summary: RunSummary,
    out: Path,
    *,
    cache_dir: Path | None = None,
    train: bool = True,
    progress: ProgressFactory | None = None,
    shards: Mapping[str, Shard] | None = None,
) -> RunSummary:
    """Attach the Local reference to a finished run's summary and rewrite its
    ``summary.json`` with it; return the new summary. ``train=False``: only a cached
    reference (the summary stays as it is without one). ``progress(clients, rounds)`` is
    entered while a reference trains (not for a cached one) and yields the callback;
    ``shards``: the clients' shards, if the caller has them already."""
    if train:
        reference: LocalReference | None = local_reference(
            config, cache_dir=cache_dir, progress=progress, shards=shards
        )
    else:
        reference = cached_local_reference(config, cache_dir=cache_dir)
    if reference is None:
        return summary
    summary = with_reference(summary, reference)
    write_atomic(out / "summary.json", summary_bytes(summary))
    return summary
