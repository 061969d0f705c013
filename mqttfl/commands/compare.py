"""``mqttfl compare``: several methods on the same federation and seeds, one after another."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mqttfl.algorithms import algorithm_names
from mqttfl.errors import UsageError
from mqttfl.evaluation.compare import ComparePlan, compare


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


def _parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError(f"--{what} needs at least one value")
    return items


def cmd_compare(args: argparse.Namespace) -> int:
    methods = algorithm_names() if args.methods == "all" else _parse_list(args.methods, "methods")
    try:
        seeds = [int(s) for s in _parse_list(args.seeds, "seeds")]
    except ValueError:
        raise UsageError(
            f"--seeds must be integers separated by commas, got {args.seeds!r}"
        ) from None
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    plan = ComparePlan(
        config=args.config,
        overrides=args.overrides,
        methods=methods,
        seeds=seeds,
        settings=_parse_list(args.settings, "settings"),
        out=args.out or Path("runs") / f"compare-{stamp}",
        resume=args.resume,
        pooled=not args.no_pooled,
    )
    return compare(plan)
