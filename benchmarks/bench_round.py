"""Whole round: end-to-end round time over the slowest client's local training time.

A real `mqttfl run` of the default job (configs/fedapa-csi.toml: 6 synthetic CSI rooms,
LargeConvNet4, one OS process per client, a local Mosquitto), for FedAPA and FedAvg. From
the run's logs, per round: cycle = coordinator's round.started(t) -> round.started(t+1);
slowest training = the largest ``upload.sent`` seconds among the clients (local epoch,
upload body, encode, publish). The ratio cycle / slowest training is the transport and
coordination overhead (the client's evaluation between rounds included). Round 1 (cold
start) is left out of the median. Goal: at most 1.10. Also reported: the cycle over the
slowest client's evaluation of the previous round plus its training (all the compute on
that client's path), which leaves only transport and coordination in the ratio.

    python -m benchmarks.bench_round [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import WORK, bench_main, log, stats
from benchmarks.federation import round_timeline, run_federation

CONFIG = "configs/fedapa-csi.toml"
METHODS = ("fedapa", "fedavg")
GOAL = 1.10


def run(quick: bool) -> dict[str, Any]:
    rounds = 4 if quick else 8
    rows: list[dict[str, Any]] = []
    for method in METHODS:
        overrides = [f"method={method}", f"rounds={rounds}", f"run_id=bench-round-{method}"]
        result = run_federation(CONFIG, overrides, WORK / f"round-{method}")
        timeline = round_timeline(result.out)
        steady = [r for r in timeline if r["round"] > 1]
        rows.append(
            {
                "method": method,
                "config": CONFIG,
                "overrides": overrides,
                "wall_s": result.wall_s,
                "ratio": stats(r["ratio"] for r in steady),
                "cycle_s": stats(r["cycle_s"] for r in steady),
                "slowest_training_s": stats(r["slowest_training_s"] for r in steady),
                "ratio_vs_eval_plus_training": stats(
                    r["ratio_vs_eval_plus_training"] for r in steady
                ),
                "coordinator_turnaround_s": stats(
                    r["coordinator_turnaround_s"] for r in steady if "coordinator_turnaround_s" in r
                ),
                "per_round": timeline,
            }
        )
        log(f"round {method}: median ratio {rows[-1]['ratio'].get('median', float('nan')):.3f}")
    figure = max(r["ratio"]["median"] for r in rows if r["ratio"].get("n"))
    return {
        "what": "median over rounds 2.. of (round.started(t) -> round.started(t+1)) / slowest client's "
        "upload.sent seconds, in a real local federation",
        "goal": {
            "text": "at most 1.10",
            "limit": GOAL,
            "figure": figure,
            "met": figure <= GOAL,
            "figure_is": "the larger of the methods' medians",
        },
        "methods": rows,
    }


def main() -> None:
    bench_main("round", "whole-round benchmark", run)


if __name__ == "__main__":
    main()
