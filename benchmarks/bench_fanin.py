"""Fan-in: N torch-free load clients each upload one 21 KB prototype message at once.

Measured: from the moment the load process hands the first upload to MQTT until the
real coordinator has received *and validated* the last one (its upload gate: decode,
envelope, selection, duplicate and schema checks), for N = 10, 100, 500. Reference
without mqttfl: the same burst into one plain aiomqtt subscriber that only counts.
Harness: :mod:`benchmarks.loadfed`.

    python -m benchmarks.bench_fanin [--quick]
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import bench_main, log, stats
from benchmarks.loadfed import coordinator_under_load, raw_fanin

SIZES = (10, 100, 500)


def rounds_for(quick: bool) -> int:
    return 3 if quick else 12


def run(quick: bool) -> dict[str, Any]:
    rounds = rounds_for(quick)
    rows = []
    for n in SIZES:
        log(f"fan-in: N={n}")
        loaded = coordinator_under_load(n, rounds)
        raw = raw_fanin(n, rounds)
        accepted = [r for r in loaded["rounds"] if r.get("uploads_accepted") == n]
        rows.append(
            {
                "n": n,
                "upload_bytes": loaded["rounds"][0]["upload_bytes"] if loaded["rounds"] else None,
                "coordinator_fanin_s": stats(r["fanin_s"] for r in accepted),
                "raw_aiomqtt_fanin_s": stats(r["fanin_s"] for r in raw["rounds"]),
                "publisher_all_acked_s": stats(r["publish_acked_s"] for r in accepted),
                "rounds_complete": len(accepted),
                "rounds": rounds,
                "rejections": loaded["rejections"],
                "load_process_imported_torch": loaded["load_process_imported_torch"],
                "per_round": loaded["rounds"],
                "raw_per_round": raw["rounds"],
            }
        )
    return {
        "what": "time from the first of N simultaneous 21 KB FedAPA uploads being published until the "
        "coordinator has received and validated all N (median over rounds)",
        "reference": "50 clients in one process: 107 ms with raw aiomqtt (issue text)",
        "sizes": rows,
    }


def main() -> None:
    bench_main("fanin", "fan-in benchmark", run)


if __name__ == "__main__":
    main()
