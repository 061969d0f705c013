"""Simulated federations on one machine: mqttfl against Flower's Simulation Engine.

The same FedAvg job on both sides: configs/fedapa-csi.toml with ``method=fedavg`` and
small shards (``SHARD``), the same model, recipe, seed and rounds, N clients of which
``K`` train each round (every client at N=10, 10 at N=100 and N=1,000). mqttfl runs as
`mqttfl run --fleets F --plain --no-local-reference` (a local Mosquitto, the coordinator,
F fleet processes holding the clients); Flower as ``run_simulation`` with its Ray backend
and its default resources (:mod:`benchmarks.flower_simulation`, in the benchmark venv of
benchmarks/requirements.txt). Runs alternate (mqttfl, Flower, mqttfl, ...).

Reported per side and N: wall time from process start to exit, seconds per round (the
median interval between round ends), the peak of the summed PSS of the whole process
tree (sampled every ``SAMPLE_EVERY_S``), and the final round's mean test accuracy over
the clients that scored it (mqttfl: every client scores the last round, and before it
only the K that trained, ``federation.evaluate=when_trained``; Flower: the K it sampled
to evaluate). Ratios are mqttfl over Flower, medians of the runs that completed; a run
still going after ``RUN_TIMEOUT_S`` is killed, kept in the JSON and left out of them.

    python -m benchmarks.bench_simulation [--quick]     # --quick: N=10 only, one run each

``BENCH_SIMULATION_SIZES=100`` runs only the sizes named, ``BENCH_SIMULATION_REPEATS=1``
one run per side, ``BENCH_SIMULATION_FLEETS=2`` that many fleets for mqttfl.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_flower import bench_python, flower_available
from benchmarks.common import (
    REPO,
    WORK,
    bench_main,
    event_time,
    log,
    pss_mb,
    read_jsonl,
    stats,
)

CONFIG = "configs/fedapa-csi.toml"
SHARD = ["method=fedavg", "data.samples_per_client=100"]
ROUNDS = 5
SIZES = {10: 10, 100: 10, 1000: 10}  # N -> clients training each round
SAMPLE_EVERY_S = 1.0
RUN_TIMEOUT_S = 1800.0  # a run past this is killed and left out of the medians


def _tree(root: int) -> list[int]:
    """``root`` and every process below it, from one pass over /proc."""
    below: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                below.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(below.get(pid, []))
    return found


class PeakPss(threading.Thread):
    """The largest sum of PSS over a process tree, sampled until the tree's root exits."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.process, self.peak_mb = process, 0.0

    def run(self) -> None:
        while self.process.poll() is None:
            total = sum(pss_mb(pid) or 0.0 for pid in _tree(self.process.pid))
            self.peak_mb = max(self.peak_mb, total)
            time.sleep(SAMPLE_EVERY_S)


def _timed(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run, in a session of its own: past ``RUN_TIMEOUT_S`` its whole process group is
    killed and the run counts as failed."""
    timed_out = False
    with open(log_path, "wb") as handle:
        began = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        sampler = PeakPss(process)
        sampler.start()
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        wall = time.monotonic() - began
        sampler.join()
    return {
        "exit_code": process.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "peak_pss_mb": round(sampler.peak_mb, 1),
    }


def _per_round(ends: list[float]) -> float | None:
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return round(statistics.median(gaps), 3) if gaps else None


def run_mqttfl(n: int, k: int, index: int) -> dict[str, Any]:
    out = WORK / "simulation" / f"mqttfl-{n}-{index}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a fleet per core (they build their clients in parallel), more above 100 clients each
    default = min(8, n, max(os.cpu_count() or 1, n // 100))
    fleets = int(os.environ.get("BENCH_SIMULATION_FLEETS") or default)
    argv = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--plain", "--no-local-reference"]
    argv += ["--out", str(out), "--fleets", str(fleets)]
    overrides = [
        *SHARD,
        f"rounds={ROUNDS}",
        f"federation.num_clients={n}",
        f"federation.fraction={k / n}",
        f"federation.min_clients={k}",
        "federation.join_timeout_s=1800",
        "federation.round_timeout_s=600",
        # every client scores the last round: at N=1,000 that takes 20-30 s, near the
        # default 30 s, and a client cut off by it would leave the accuracy column
        "federation.final_metrics_timeout_s=600",
        # as Flower evaluates only the clients it samples: an idle client applies the
        # downlink and scores nothing (every client scores the last round)
        "federation.evaluate=when_trained",
    ]
    for item in overrides:
        argv += ["--set", item]
    result = _timed(argv, out.parent / f"mqttfl-{n}-{index}.out")
    events = read_jsonl(out / "logs" / "coordinator.jsonl") if (out / "logs").is_dir() else []
    closes = [event_time(e) for e in events if e.get("event") == "round.closed"]
    records = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    last = [r["accuracy"] for r in records if r.get("round") == ROUNDS]
    return {
        **result,
        "fleets": fleets,
        "rounds_closed": len(closes),
        "round_s": _per_round(closes),
        "final_accuracy": round(statistics.fmean(last), 4) if last else None,
        "evaluations": len(last),
    }


def run_flower(n: int, k: int, index: int) -> dict[str, Any]:
    out = WORK / "simulation" / f"flower-{n}-{index}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    argv = [str(bench_python()), "-m", "benchmarks.flower_simulation", "--config", CONFIG]
    argv += ["--clients", str(n), "--per-round", str(k), "--rounds", str(ROUNDS)]
    argv += ["--out", str(out)]
    for item in SHARD:
        argv += ["--set", item]
    result = _timed(argv, out.with_suffix(".out"), env={"FLWR_TELEMETRY_ENABLED": "0"})
    record = json.loads(out.read_text()) if out.is_file() else {"marks": []}
    evaluated = [m for m in record["marks"] if "evaluated" in m]
    return {
        **result,
        "flwr": record.get("flwr"),
        "rounds_closed": len(evaluated),
        "round_s": _per_round([m["evaluated"] for m in evaluated]),
        "final_accuracy": round(evaluated[-1]["mean_accuracy"], 4) if evaluated else None,
        "evaluations": evaluated[-1]["evaluations"] if evaluated else 0,
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    """Over the runs that completed (exit 0); every run stays in the JSON."""
    values = [r[key] for r in runs if r.get(key) is not None and r["exit_code"] == 0]
    return statistics.median(values) if values else None


def run(quick: bool) -> dict[str, Any]:
    missing = flower_available()
    if missing is not None:
        return {"skipped": f"{missing}; install it as benchmarks/requirements.txt says"}
    named = [int(v) for v in os.environ.get("BENCH_SIMULATION_SIZES", "").split(",") if v]
    sizes = {10: SIZES[10]} if quick else {n: SIZES.get(n, min(10, n)) for n in named or SIZES}
    repeats = 1 if quick else int(os.environ.get("BENCH_SIMULATION_REPEATS", "3"))
    results: dict[str, Any] = {}
    for n, k in sizes.items():
        sides: dict[str, list[dict[str, Any]]] = {"mqttfl": [], "flower": []}
        for index in range(repeats):
            for name, side in (("mqttfl", run_mqttfl), ("flower", run_flower)):
                outcome = side(n, k, index)
                log(f"N={n} {name} run {index}: {outcome}")
                sides[name].append(outcome)

        entry: dict[str, Any] = {"clients": n, "per_round": k, "runs": sides}
        for key in ("wall_s", "round_s", "peak_pss_mb", "final_accuracy"):
            ours, theirs = _median(sides["mqttfl"], key), _median(sides["flower"], key)
            entry[key] = {"mqttfl": ours, "flower": theirs}
            if ours is not None and theirs:
                entry[key]["ratio"] = round(ours / theirs, 3)
        entry["wall_s_mqttfl"] = stats(r["wall_s"] for r in sides["mqttfl"] if r["exit_code"] == 0)
        results[str(n)] = entry
    return {"rounds": ROUNDS, "task": SHARD, "sizes": results}


def main() -> None:
    bench_main("simulation", "mqttfl vs Flower's simulation engine", run)


if __name__ == "__main__":
    main()
