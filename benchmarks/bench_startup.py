"""Start-up: how long a federation takes to reach its first round, and what a client
process spends before it can train.

Two jobs, each run as `mqttfl run JOB --plain --no-local-reference` (a local Mosquitto,
the coordinator, one `mqttfl clients` parent forking a process per client):

* ``digits``: configs/digits-smoke.toml (3 clients on scikit-learn's 8x8 digits);
* ``csi-tiny``: configs/fedapa-csi.toml with the tests' tiny settings (3 clients, the tiny
  model, windows of 24 packets, 60 windows each, 3 rounds).

Per run: the wall time of the whole command, and from the coordinator's ``run.started`` to
its ``round.started`` of round 1 (the clients' start-up: the manifest's wait, torch's import,
forking, each shard, each runner). Then, for each job, one `mqttfl client` started by hand
against its running coordinator: from the process's start to its ``client.started``.

``BENCH_STARTUP_TREES=/a:/b`` runs the same jobs from two checkouts (``PYTHONPATH`` set to
each, the same venv), alternated a, b, a, b, ...; the ratios are b over a. Without it the
checkout this module is in runs alone.

    python -m benchmarks.bench_startup [--quick]     # quick: one run of each
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, WORK, bench_main, event_time, log, read_jsonl, stats
from mqttfl.provisioning.local_broker import LocalBroker

TINY = [
    "model.name=tiny",
    "data.window=24",
    "data.samples_per_client=60",
    "rounds=3",
    "federation.num_clients=3",
]
JOBS: dict[str, tuple[str, list[str]]] = {
    "digits": ("configs/digits-smoke.toml", []),
    "csi-tiny": ("configs/fedapa-csi.toml", TINY),
}
REPEATS = 3


def _trees() -> list[Path]:
    named = os.environ.get("BENCH_STARTUP_TREES")
    return [Path(p) for p in named.split(":")] if named else [REPO]


def _env(tree: Path, log_dir: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if log_dir is not None:
        env["MQTTFL_LOG_DIR"] = str(log_dir)
    return env


def _first(events: list[dict[str, Any]], name: str) -> float:
    return next(event_time(e) for e in events if e.get("event") == name)


def run_job(tree: Path, job: str, index: int) -> dict[str, Any]:
    config, overrides = JOBS[job]
    out = WORK / "startup" / f"{job}-{tree.name}-{index}"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "mqttfl", "run", str(tree / config), "--plain"]
    argv += ["--no-local-reference", "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    began = time.monotonic()
    done = subprocess.run(argv, env=_env(tree), cwd=out.parent, capture_output=True, timeout=900)
    wall = time.monotonic() - began
    events = read_jsonl(out / "logs" / "coordinator.jsonl")
    return {
        "tree": str(tree),
        "job": job,
        "exit": done.returncode,
        "wall_s": round(wall, 3),
        "run_started_to_round_1_s": round(
            _first(events, "round.started") - _first(events, "run.started"), 3
        ),
    }


def hand_started_client(tree: Path, job: str, index: int) -> dict[str, Any]:
    """A coordinator of ``job`` up first; then one `mqttfl client` process, timed from its
    start to its ``client.started`` (the manifest, its shard, torch, its runner)."""
    work = WORK / "startup" / f"client-{job}-{tree.name}-{index}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config, overrides = JOBS[job]
    common = ["--config", str(tree / config)]
    for item in [*overrides, "federation.num_clients=1", "federation.min_clients=1"]:
        common += ["--set", item]
    with LocalBroker(work / "broker") as broker:
        common += ["--broker", broker.url]
        logs = work / "logs"
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "mqttfl", "coordinator", *common, "--out", str(work / "run")],
            env=_env(tree, logs),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while not any(
                e.get("event") == "run.started" for e in read_jsonl(logs / "coordinator.jsonl")
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the coordinator did not start")
                time.sleep(0.05)
            argv_client = [sys.executable, "-m", "mqttfl", "client", *common, "--id", "0"]
            began = time.time()
            client = subprocess.run(
                [*argv_client, "--state-dir", str(work / "state")],
                env=_env(tree, logs),
                capture_output=True,
                timeout=600,
            )
            coordinator.wait(timeout=120)
        finally:
            if coordinator.poll() is None:
                coordinator.kill()
                coordinator.wait()
    events = read_jsonl(logs / "client-0.jsonl")
    return {
        "tree": str(tree),
        "job": job,
        "exit": client.returncode,
        "process_start_to_client_started_s": round(_first(events, "client.started") - began, 3),
    }


def _medians(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    return {
        tree: stats(r[key] for r in rows if r["tree"] == tree) for tree in {r["tree"] for r in rows}
    }


def run(quick: bool = False) -> dict[str, Any]:
    trees = _trees()
    repeats = 1 if quick else REPEATS
    jobs: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    for index in range(repeats):
        for job in JOBS:
            for tree in trees:
                log(f"startup: {job} from {tree}, run {index + 1} of {repeats}")
                jobs.append(run_job(tree, job, index))
        for job in JOBS:
            for tree in trees:
                log(f"startup: a hand-started {job} client from {tree}, run {index + 1}")
                clients.append(hand_started_client(tree, job, index))
    result: dict[str, Any] = {
        "trees": [str(t) for t in trees],
        "jobs": {
            job: {
                "wall_s": _medians([r for r in jobs if r["job"] == job], "wall_s"),
                "run_started_to_round_1_s": _medians(
                    [r for r in jobs if r["job"] == job], "run_started_to_round_1_s"
                ),
            }
            for job in JOBS
        },
        "client_process_start_to_started_s": {
            job: _medians(
                [r for r in clients if r["job"] == job], "process_start_to_client_started_s"
            )
            for job in JOBS
        },
        "runs": jobs,
        "clients": clients,
    }
    if len(trees) == 2:
        a, b = (str(t) for t in trees)

        def ratio(figures: dict[str, dict[str, float]]) -> float:
            return round(figures[b]["median"] / figures[a]["median"], 3)

        result["ratios_b_over_a"] = {
            **{
                f"{job} {key}": ratio(result["jobs"][job][key])
                for job in JOBS
                for key in ("wall_s", "run_started_to_round_1_s")
            },
            **{
                f"{job} client process start to client.started": ratio(
                    result["client_process_start_to_started_s"][job]
                )
                for job in JOBS
            },
        }
    result["failed_runs"] = sum(1 for r in [*jobs, *clients] if r["exit"] != 0)
    return result


if __name__ == "__main__":
    bench_main("startup", __doc__ or "", run)
