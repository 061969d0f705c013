"""Run the benchmarks, write benchmarks/results/<name>[-quick].json, print the goals.

    python -m benchmarks.run_all [--quick] [--only NAME[,NAME...] | --all]

The benchmarks, their order and the default set are :data:`benchmarks.registry.BENCHMARKS`
(``--help`` lists them); every one runs with ``--only NAME``, ``--all`` runs them all. Only
one federation runs at a time (they run one after another). A benchmark that fails is
recorded as failed and the others still run; the exit code is 1 if any failed. The goals
table is also written to results/goals[-quick].json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

from benchmarks.common import REPO, RESULTS, log, now_utc, write_result
from benchmarks.registry import BENCHMARKS, BY_NAME, default_names


def goals(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every goal of the issue with its figure, from the benchmarks that ran."""
    rows: list[dict[str, Any]] = []

    def add(goal: str, figure: str, met: bool | None) -> None:
        rows.append({"goal": goal, "figure": figure, "met": met})

    if (r := results.get("coordinator")) and "goal" in r:
        g = r["goal"]
        add(
            "coordinator overhead <= 20 ms at N=100",
            f"{g['figure_s'] * 1000:.1f} ms" if g["figure_s"] is not None else "n/a",
            g["met"],
        )
    if (r := results.get("aggregation")) and "goal" in r:
        g = r["goal"]
        add("FedAPA aggregation <= 200 ms at N=1000", f"{g['figure_s'] * 1000:.0f} ms", g["met"])
    if (r := results.get("round")) and "goal" in r:
        g = r["goal"]
        add("round time / slowest training <= 1.10", f"{g['figure']:.3f}", g["met"])
    if (r := results.get("bytes")) and "goal" in r:
        g = r["goal"]
        add(
            "framing overhead <= 2%",
            f"{g['figure'] * 100:.2f}%" if g["figure"] is not None else "n/a",
            g["met"],
        )
    if (r := results.get("flower")) and "goal" in r:
        g = r["goal"]
        add(
            "mqttfl no slower than Flower (wall ratio <= 1)",
            f"{g['figure']:.3f} (bytes ratio {r['bytes_ratio']:.3f})",
            g["met"],
        )
    elif r and "skipped" in r:
        add("mqttfl no slower than Flower", r["skipped"], None)
    if r := results.get("scale"):
        g = r["bytes"]["goal"]
        add(g["goal"], f"{g['figure_bytes'] / 1000:.1f} KB", g["met"])
        for g in r["rounds"]["goals"]:
            figure = g["figure_s"]
            add(g["goal"], "n/a" if figure is None else f"{figure * 1000:.0f} ms", g["met"])
        g = r["startup"]["goal"]
        add(g["goal"], f"{g['figure_s'] * 1000:.0f} ms (slowest median)", g["met"])
    if r := results.get("fleet", {}).get("federation"):
        for g in r["goals"]:
            unit = "figure_mb" if "figure_mb" in g else "figure_gb"
            add(g["goal"], f"{g[unit]:.1f} {unit[-2:].upper()}", g["met"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description="run the mqttfl benchmarks")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke check of every benchmark"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--only",
        help=f"comma-separated subset of: {', '.join(BY_NAME)} "
        f"(default: {', '.join(default_names())})",
    )
    which.add_argument("--all", action="store_true", help="every benchmark, in order")
    args = parser.parse_args()
    os.chdir(REPO)  # configs/ and `python -m` paths are relative to the checkout
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
    else:
        names = list(BY_NAME) if args.all else default_names()
    unknown = sorted(set(names) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BY_NAME)}")
    command = (
        "python -m benchmarks.run_all"
        + (" --quick" if args.quick else "")
        + (f" --only {args.only}" if args.only else "")
        + (" --all" if args.all else "")
    )
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    began = time.monotonic()
    for bench in [b for b in BENCHMARKS if b.name in names]:
        name = bench.name
        log(f"=== {name} ===")
        started = time.monotonic()
        try:
            data = bench.run(args.quick)
        except Exception:
            failed[name] = traceback.format_exc()
            log(f"{name} failed:\n{failed[name]}")
            continue
        data["seconds"] = time.monotonic() - started
        results[name] = data
        path = write_result(bench.result, data, quick=args.quick, command=command)
        log(f"{name}: {data['seconds']:.0f} s -> {path}")
    table = goals(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"goals{'-quick' if args.quick else ''}.json").write_text(
        json.dumps(
            {
                "date": now_utc(),
                "command": command,
                "seconds": time.monotonic() - began,
                "goals": table,
                "failed": sorted(failed),
            },
            indent=2,
        )
        + "\n"
    )
    sys.stdout.write("\n| goal | figure | met |\n|---|---|---|\n")
    for row in table:
        met = {True: "yes", False: "no", None: "skipped"}[row["met"]]
        sys.stdout.write(f"| {row['goal']} | {row['figure']} | {met} |\n")
    if failed:
        sys.stdout.write(f"\nfailed: {', '.join(sorted(failed))}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
