"""``mqttfl report``: markdown tables and PNG plots from finished runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mqttfl.evaluation.report import write_report


def cmd_report(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.run_dirs]
    out = args.out or (paths[0] / "report" if len(paths) == 1 else Path("report"))
    report = write_report(paths, out)
    sys.stdout.write(report.read_text() + f"\nreport: {report}\n")
    return 0


def add_report_command(subparsers: Any) -> None:
    """Register ``mqttfl report`` on the main parser's subcommands."""
    parser = subparsers.add_parser(
        "report", help="markdown tables and PNG plots from finished runs"
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (or folders holding them, e.g. a compare output)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="output directory (default RUN_DIR/report for one run, ./report for several)",
    )
    parser.set_defaults(func=cmd_report)
