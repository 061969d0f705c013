"""Buffered asynchronous aggregation (FedBuff, ``federation.mode = "buffered"``) against
synchronous rounds, with 2 clients 5× slower than the others.

How the slow devices are made: **the engine's test clock, in process**
(:class:`mqttfl.testing.clocked.ClockedFederation`), not a cgroup CPU quota. The
coordinator's own engine (rounds or buffered) runs with the methods' real client sides
on the job's real shards, and every local training really runs (one at a time, in this
process); only time is simulated. One calibration round times each client's training;
their median per training sample times a client's sample count is that client's
simulated seconds per training, 5× that for the two slow ones (a per-sample cost keeps
the clients' relative speeds free of the shared machine's noise: only the common scale
is measured). Times below are that clock: training only, no communication or evaluation
time (no broker in the loop), the same per-client costs in every run of a job, so the
runs differ only in how the engine schedules.

Per job (the default job, configs/fedapa-csi.toml, 6 clients, slow 4 and 5; ESPectre,
configs/presence-espectre.toml, 5 clients, slow 3 and 4), three runs:

* ``rounds``: synchronous rounds as the job has them, waiting for every client (its
  deadline never fires);
* ``rounds-deadline``: synchronous rounds with a deadline of 1.5× the slowest fast
  client's training: the slow clients miss every round (their late uploads are refused);
* ``buffered``: buffer_size 3, max_staleness 8, FedBuff's s(τ) = 1/sqrt(1+τ), run for as
  long as ``rounds`` took (simulated).

The accuracy curve has one point per close: the mean over clients of each client's mean
over its last 5 evaluations (summary.json's measure, so the last point of ``rounds`` is its
final accuracy). Reported: the time each run first reaches ``rounds``' final accuracy
(within 1 point), its accuracy at ``rounds``' wall time, bytes per client-update (up; and
down per client per version), the staleness distribution of the aggregated uploads.
Goal: ``rounds``' final accuracy (within 1 point) in ≤ 0.6× its wall time.

    nice -n 10 python -m benchmarks.bench_buffered [--quick]   # quick: 4 rounds, default job
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import bench_main, log
from mqttfl.config import RunConfig, load_config
from mqttfl.evaluation.pooled import client_shards
from mqttfl.logs import configure_logging
from mqttfl.testing.clocked import ClockedFederation, Trace

SLOWDOWN = 5.0
BUFFER_SIZE, MAX_STALENESS = 3, 8
GOAL_RATIO, TOLERANCE = 0.6, 0.01
VERSIONS = 10_000  # buffered: a bound; it runs for the synchronous run's wall time
JOBS = {
    "default": ("configs/fedapa-csi.toml", ("4", "5")),
    "espectre": ("configs/presence-espectre.toml", ("3", "4")),
}


def _config(path: str, overrides: list[str]) -> RunConfig:
    return load_config(path, ["method=fedapa", "train.torch_threads=1", *overrides])


def _costs(path: str, shards: dict[str, Any], slow: tuple[str, ...]) -> dict[str, float]:
    """Simulated seconds per local training: one calibration round measures each client's
    training; their median per training sample, times each client's sample count (5× for
    the slow ones). A per-sample cost keeps the clients' relative speeds free of the shared
    machine's noise; only the common scale is measured."""
    measured: dict[str, float] = {}

    def seconds(client: str, took: float) -> float:
        measured[client] = took
        return took

    ClockedFederation(_config(path, ["rounds=1"]), shards, seconds=seconds).run()
    per_sample = statistics.median(measured[c] / len(shards[c].y_train) for c in measured)
    return {
        c: per_sample * len(shards[c].y_train) * (SLOWDOWN if c in slow else 1.0)
        for c in sorted(shards, key=int)
    }


def _run(
    config: RunConfig, shards: dict[str, Any], costs: dict[str, float], *, until: float = 0.0
) -> Trace:
    """One federation on the test clock, each training ``costs[client]`` seconds; with
    ``until``, stopped once that much simulated time has passed."""
    began = time.perf_counter()
    fed = ClockedFederation(config, shards, seconds=lambda client, _: costs[client])
    if until:
        fed.until(lambda f: f.now() >= until, max_steps=1_000_000)
        fed.trace.summary = fed.trace.summary or fed.engine.summary()
    trace = fed.run() if not until else fed.trace
    log(
        f"{config.run_id} {config.federation.mode}: {len(trace.closes)} closes, "
        f"simulated {trace.closes[-1][0]:.1f} s, real {time.perf_counter() - began:.0f} s"
    )
    return trace


def _reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve is within 1 point of ``target``."""
    return next((t for t, acc in curve if acc >= target - TOLERANCE), None)


def _stay(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time from which the curve never again falls 1 point below ``target``."""
    since = None
    for t, acc in curve:
        if acc < target - TOLERANCE:
            since = None
        elif since is None:
            since = t
    return since


def _at(curve: list[tuple[float, float]], when: float) -> float | None:
    before = [acc for t, acc in curve if t <= when + 1e-3]  # (the curve's times: 3 decimals)
    return before[-1] if before else None


def derive(job: dict[str, Any]) -> dict[str, Any]:
    """A job's figures from its runs' curves: time to ``rounds``' final accuracy (first
    reached, and held from then on), accuracy at ``rounds``' wall time, the goal."""
    runs = job["runs"]
    target, wall = runs["rounds"]["final_accuracy"], runs["rounds"]["wall_s"]
    for figures in runs.values():
        curve = [(t, acc) for t, _, acc in figures["curve"]]
        for key, when in (
            ("time_to_target", _reach(curve, target)),
            ("time_to_hold", _stay(curve, target)),
        ):
            figures[f"{key}_s"] = when
            figures[f"{key}_ratio"] = None if when is None else when / wall
        figures["accuracy_at_rounds_wall"] = _at(curve, wall)
    ratio = runs["buffered"]["time_to_target_ratio"]
    job["target_accuracy"] = target
    job["goal"] = {
        "goal": f"rounds' final accuracy (within 1 point) in <= {GOAL_RATIO}x its wall time",
        "figure": ratio,
        "held_from": runs["buffered"]["time_to_hold_ratio"],
        "met": ratio is not None and ratio <= GOAL_RATIO,
    }
    return job


def _figures(trace: Trace) -> dict[str, Any]:
    summary = trace.summary
    ups = [size for _, _, _, size in trace.uploads]
    return {
        "wall_s": trace.closes[-1][0],
        "closes": len(trace.closes),
        # (time, version, mean over clients of each one's last 5 accuracies)
        "curve": [
            [round(t, 3), v, round(acc, 4)]
            for (t, v, _), acc in zip(trace.closes, trace.smoothed, strict=True)
        ],
        "final_accuracy": trace.smoothed[-1],
        "summary_accuracy": None if summary is None else summary.mean.accuracy,
        "uploads_accepted": len(ups),
        "uploads_refused": len(trace.rejected),
        "refused_reasons": sorted({r for *_, r in trace.rejected}),
        "up_bytes_per_update": sum(ups) / max(len(ups), 1),
        "down_bytes_per_client_version": sum(trace.down_bytes) / max(len(trace.down_bytes), 1),
        "staleness": summary.buffered.staleness if summary and summary.buffered else None,
        "compute_s": trace.compute_s,
    }


def _job(name: str, quick: bool) -> dict[str, Any]:
    path, slow = JOBS[name]
    base = _config(path, ["rounds=4"] if quick else [])
    rounds, n = base.rounds, base.federation.num_clients
    shards = client_shards(base)
    costs = _costs(path, shards, slow)
    runs: dict[str, dict[str, Any]] = {"rounds": _figures(_run(base, shards, costs))}
    wall = runs["rounds"]["wall_s"]
    deadline = round(1.5 * max(cost for c, cost in costs.items() if c not in slow), 3)
    timed = _config(path, [f"rounds={rounds}", f"federation.round_timeout_s={deadline}"])
    runs["rounds-deadline"] = _figures(_run(timed, shards, costs))
    buffered = _config(
        path,
        [
            f"rounds={VERSIONS}",  # more than it needs: it stops at the rounds' wall time
            "federation.mode=buffered",
            f"federation.buffer_size={BUFFER_SIZE}",
            f"federation.max_staleness={MAX_STALENESS}",
        ],
    )
    runs["buffered"] = _figures(_run(buffered, shards, costs, until=wall))
    return {
        "config": path,
        "rounds": rounds,
        "clients": n,
        "slow_clients": list(slow),
        "slowdown": SLOWDOWN,
        "training_s_per_client": costs,
        "deadline_s": deadline,
        "buffered": {"buffer_size": BUFFER_SIZE, "max_staleness": MAX_STALENESS},
        "runs": runs,
    }


def run(quick: bool) -> dict[str, Any]:
    configure_logging(None, level="error")  # the engine's round lines, 6 runs of them
    jobs = ["default"] if quick else list(JOBS)
    return {
        "clock": "the engine's test clock in process (mqttfl.testing.clocked), not a cgroup quota",
        "jobs": {name: derive(_job(name, quick)) for name in jobs},
    }


if __name__ == "__main__":
    bench_main("buffered", __doc__.splitlines()[0], run)
