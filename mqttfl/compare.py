"""`mqttfl compare`: several methods on the same federation and seeds, one run after another.

Every (setting, method, seed) is a full local federation (:class:`LocalFederation`:
broker, coordinator, one process per client) in its own run directory. The two settings
are FedAPA Table III's halves: ``data`` (statistical heterogeneity only, the config's
model for every client) and ``model`` (clients cycle through tiny, middle and large).
A method that needs a particular model (``REQUIRED_MODEL``) runs with it in both
settings, and the tables say so; ``METHOD@MODEL`` (e.g. ``fedavg@transformer``) pins any
method to a model in the same way, to compare methods on one architecture. Results: ``compare.md`` and ``compare.json`` (accuracy,
macro-F1, MAE and KB per client-round as mean ± std over seeds; each run's metrics are
its summary's means over the last five rounds) and ``convergence.png`` (mean client
accuracy per round, averaged over seeds).

Two reference rows frame the methods: ``local`` (every client alone, the lower bound;
part of ``--methods all``) and ``pooled`` (:mod:`mqttfl.pooled`: one model with the same
architecture and ``[train]`` recipe, trained for as many epochs as a Local client on the
union of all clients' training splits, scored on each client's test split; trained in
this process, per setting and seed, and kept in ``<setting>/pooled/seed-<n>/``). Where
the clients' data cannot be pooled (samples of different shapes, or different
architectures as in the ``model`` setting) the row is absent and the table says why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mqttfl.algorithms import algorithm_names, get_algorithm, make_context
from mqttfl.compare_entries import (
    SETTINGS,
    RunResult,
    method_name,
    pinned_model,
    pooled_overrides,
    run_one,
    run_overrides,
)
from mqttfl.compare_report import aggregate, aggregate_pooled, markdown_table, plot_convergence
from mqttfl.config import load_config
from mqttfl.errors import MqttflError
from mqttfl.logs import configure_logging, get_logger
from mqttfl.pooled import PooledRun, run_pooled


def _parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise MqttflError(f"--{what} needs at least one value")
    return items


def cmd_compare(args: argparse.Namespace) -> int:
    methods = algorithm_names() if args.methods == "all" else _parse_list(args.methods, "methods")
    for method in methods:
        get_algorithm(method_name(method))  # ConfigError naming the known methods
    try:
        seeds = [int(s) for s in _parse_list(args.seeds, "seeds")]
    except ValueError:
        raise MqttflError(
            f"--seeds must be integers separated by commas, got {args.seeds!r}"
        ) from None
    settings = _parse_list(args.settings, "settings")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise MqttflError(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    plan = [(s, m, seed) for s in settings for m in methods for seed in seeds]
    for setting, method, seed in plan:  # every config must load before anything starts
        make_context(load_config(args.config, run_overrides(args.overrides, setting, method, seed)))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("runs") / f"compare-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    configure_logging(out / "compare.jsonl", level="info", console_level="warning")
    log = get_logger(client_id="compare")
    results = []
    for index, (setting, method, seed) in enumerate(plan, start=1):
        began = time.monotonic()
        result = run_one(
            args.config,
            run_overrides(args.overrides, setting, method, seed),
            RunResult(setting, method, seed, out / setting / method / f"seed-{seed}"),
            resume=args.resume,
        )
        results.append(result)
        seconds = round(time.monotonic() - began, 1)
        log.info(
            "compare.run_finished",
            setting=setting,
            method=method,
            seed=seed,
            seconds=seconds,
            error=result.error,
            resumed=result.resumed,
            **result.metrics,
        )
        status = (
            f"failed: {result.error}"
            if result.error
            else (
                f"acc {result.metrics['accuracy']:.4f}  f1 {result.metrics['f1']:.4f}  "
                f"mae {result.metrics['mae']:.3f}  {result.metrics['kb']:.1f} KB"
            )
        )
        took = "reused a finished run" if result.resumed else f"{seconds} s"
        sys.stdout.write(
            f"[{index}/{len(plan)}] {setting:<5} {method:<32} seed {seed}: {status} ({took})\n"
        )
        sys.stdout.flush()
    pooled_runs = [] if args.no_pooled else _run_pooled_references(args, settings, seeds, out)
    rows = aggregate(results, methods, settings)
    pooled = None if args.no_pooled else aggregate_pooled(pooled_runs, settings)
    (out / "compare.md").write_text(markdown_table(rows, methods, settings, seeds, pooled))
    (out / "compare.json").write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "seeds": seeds,
                "settings": {
                    s: {"title": SETTINGS[s][0], "overrides": SETTINGS[s][1]} for s in settings
                },
                "required_model": {m: model for m in methods if (model := pinned_model(m))},
                "rows": rows,
                "pooled": pooled,
                "pooled_runs": [
                    {
                        "setting": p.setting,
                        "seed": p.seed,
                        "out": str(p.out),
                        "metrics": p.metrics,
                        "per_client": p.per_client,
                        "absent": p.absent,
                    }
                    for p in pooled_runs
                ],
                "runs": [
                    {
                        "setting": r.setting,
                        "method": r.method,
                        "seed": r.seed,
                        "out": str(r.out),
                        "metrics": r.metrics,
                        "curve": {str(t): a for t, a in r.curve.items()},
                        "error": r.error,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n"
    )
    plot_convergence(results, methods, settings, out / "convergence.png", pooled)
    sys.stdout.write((out / "compare.md").read_text() + f"results: {out}\n")
    return 1 if any(r.error for r in results) else 0


def _run_pooled_references(
    args: argparse.Namespace, settings: list[str], seeds: list[int], out: Path
) -> list[PooledRun]:
    log = get_logger(client_id="compare")
    runs = []
    for setting in settings:
        for seed in seeds:
            began = time.monotonic()
            run = run_pooled(
                args.config,
                pooled_overrides(args.overrides, setting, seed),
                PooledRun(setting, seed, out / setting / "pooled" / f"seed-{seed}"),
                resume=args.resume,
            )
            runs.append(run)
            seconds = round(time.monotonic() - began, 1)
            log.info(
                "compare.pooled_finished",
                setting=setting,
                seed=seed,
                seconds=seconds,
                absent=run.absent,
                resumed=run.resumed,
                **run.metrics,
            )
            status = (
                f"absent: {run.absent}"
                if run.absent
                else f"acc {run.metrics['accuracy']:.4f}  f1 {run.metrics['f1']:.4f}  "
                f"mae {run.metrics['mae']:.3f}"
            )
            took = "reused" if run.resumed else f"{seconds} s"
            sys.stdout.write(f"[pooled] {setting:<5} seed {seed}: {status} ({took})\n")
            sys.stdout.flush()
    return runs


def add_compare_command(subparsers: Any) -> None:
    """Register ``mqttfl compare`` on the main parser's subcommands."""
    parser = subparsers.add_parser(
        "compare",
        help="run several methods on the same federation and seeds "
        "and tabulate them like FedAPA Table III",
    )
    parser.add_argument("config", help="run config (TOML)")
    parser.add_argument(
        "--methods", default="all", help="'all' or a comma-separated list, e.g. fedavg,fedapa"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--settings",
        default="data,model",
        help="data (statistical heterogeneity) and/or model (tiny/middle/large clients)",
    )
    parser.add_argument("--out", type=Path, help="results directory (default runs/compare-<time>)")
    parser.add_argument(
        "--no-pooled",
        action="store_true",
        help="skip the pooled (centralized) reference row",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse runs in --out that finished with the same config",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key for every run, e.g. --set rounds=10",
    )
    parser.set_defaults(func=cmd_compare)
