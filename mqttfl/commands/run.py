"""``mqttfl run``: a whole local federation (broker, coordinator, clients) and its table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mqttfl.commands.common import add_config_args, broker_url, positive
from mqttfl.config import load_config
from mqttfl.logs import configure_logging, get_logger
from mqttfl.paths import make_dir


def add_run_command(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run", help="run a whole local federation (broker, coordinator, clients)"
    )
    add_config_args(run, positional=True)
    run.add_argument("--out", type=Path, help="run directory (default runs/<run_id>-<time>)")
    run.add_argument(
        "--fleets",
        type=positive,
        metavar="K",
        help="run the clients in K fleet processes (contiguous id blocks) instead of one "
        "process per client",
    )
    run.add_argument(
        "--no-local-reference",
        action="store_true",
        help="skip the Local reference (each client trained alone, cached after the first "
        "run) that the result table compares every client's accuracy with",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from mqttfl.algorithms import check_models, make_context
    from mqttfl.evaluation.table import format_table
    from mqttfl.launch.local import LocalFederation, default_out_dir

    config = load_config(args.config, args.overrides)
    make_context(config)  # fail on a bad [method] table before starting anything
    check_models(config)
    # Check --broker here, once, rather than in each of the children it is passed to.
    broker = broker_url(args.broker) if args.broker else None
    out = make_dir(args.out or default_out_dir(config), what="--out")
    configure_logging(out / "logs" / "launcher.jsonl", level=config.logging.level)
    federation = LocalFederation(
        config, args.config, args.overrides, out, broker, fleets=args.fleets
    )
    summary = federation.run()
    if config.method != "local" and not args.no_local_reference:
        from mqttfl.evaluation.reference import add_local_reference

        try:
            summary = add_local_reference(config, summary, out)
        except Exception as exc:
            get_logger().warning("reference.failed", error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(format_table(summary) + f"\nrun directory: {out}\n")
    return 0
