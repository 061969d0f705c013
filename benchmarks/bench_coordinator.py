"""Coordinator overhead per round: last upload validated -> the round's downlinks published.

The real coordinator runs FedAPA (C=21, d=256) against N = 10, 100, 500 torch-free load
clients (:mod:`benchmarks.loadfed`). Per round it records when the last upload passed the
gate, the aggregation, the checkpoint, and when the broker acknowledged the last downlink
(every personal Q_i and the broadcast P) and then the next round's start message.
Beside it, the wire's floor (``raw_publish_acked_s``): the same downlinks, precomputed,
published by a plain aiomqtt client to the same N sessions the moment the last upload
arrived, with nothing of mqttfl's between (:func:`benchmarks.loadfed.raw_fanout`).
Goal: at most 20 ms at N=100 (last upload -> downlinks published). It runs with the BLAS
thread pool at its default (as ``mqttfl coordinator`` does) and again, in a child process,
with one BLAS thread, because OpenBLAS's busy-waiting threads slow the aggregation down
many times over when other work shares the cores.

    python -m benchmarks.bench_coordinator [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.common import REPO, child_process_main, log, stats
from benchmarks.loadfed import coordinator_under_load, raw_fanout

SIZES = (10, 100, 500)
GOAL_S = 0.020  # at N=100


def measure(quick: bool) -> list[dict[str, Any]]:
    from benchmarks.bench_fanin import rounds_for

    rounds = rounds_for(quick)
    rows = []
    for n in SIZES:
        log(f"coordinator overhead: N={n}")
        loaded = coordinator_under_load(n, rounds)
        done = [r for r in loaded["rounds"] if "overhead_downlinks_s" in r]
        raw = raw_fanout(n, rounds)
        rows.append(
            {
                "n": n,
                "overhead_downlinks_s": stats(r["overhead_downlinks_s"] for r in done),
                "overhead_next_start_s": stats(
                    r["overhead_next_start_s"] for r in done if "overhead_next_start_s" in r
                ),
                "aggregate_s": stats(r["aggregate_s"] for r in done),
                "publish_downlinks_s": stats(r["publish_downlinks_s"] for r in done),
                "checkpoint_s": stats(r["checkpoint_s"] for r in done if "checkpoint_s" in r),
                "upload_to_all_downlinks_held_s": stats(
                    r["last_upload_to_all_downlinks_held_s"]
                    for r in done
                    if "last_upload_to_all_downlinks_held_s" in r
                ),
                "down_bytes_per_client": stats(r["down_bytes_per_client"] for r in done),
                # the wire's floor: the same downlinks to the same sessions, published by a
                # plain aiomqtt client the moment the last upload arrived (loadfed.raw_fanout)
                "raw_publish_acked_s": stats(r["publish_acked_s"] for r in raw["rounds"]),
                "rounds": len(done),
                "rejections": loaded["rejections"],
                "per_round": loaded["rounds"],
            }
        )
    return rows


def _single_thread(quick: bool) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_coordinator",
        "--child",
        *(["--quick"] if quick else []),
    ]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=True, cwd=REPO, timeout=3600
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def run(quick: bool) -> dict[str, Any]:
    rows = measure(quick)
    single = _single_thread(quick)
    at_100 = next((r for r in rows if r["n"] == 100), None)
    figure = at_100["overhead_downlinks_s"].get("median") if at_100 else None
    return {
        "what": "time from the last upload received and validated to the broker's acknowledgement of the "
        "round's last downlink (median over rounds); overhead_next_start_s runs on to the next "
        "round's start message",
        "goal": {
            "text": "at most 20 ms at N=100",
            "limit_s": GOAL_S,
            "figure_s": figure,
            "met": figure is not None and figure <= GOAL_S,
        },
        "sizes": rows,
        "single_blas_thread_sizes": single,
    }


def main() -> None:
    child_process_main("coordinator", "coordinator overhead benchmark", measure, run)


if __name__ == "__main__":
    main()
