"""``mqttfl logs``: the JSON-lines logs of a run's processes, merged in time order."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqttfl.errors import UsageError
from mqttfl.monitor.logview import LEVELS, Event, EventFilter, LogSources, show


def add_logs_command(subparsers: Any) -> None:
    """Register ``mqttfl logs`` on the main parser's subcommands."""
    parser = subparsers.add_parser(
        "logs",
        help="the logs of a run's processes, merged in time order",
        description="Read the JSON-lines logs of the coordinator, the client devices and "
        "the launcher, merged on their timestamps: `mqttfl logs RUN_DIR --round 21` follows "
        "one round across every process. On a terminal one readable line per event; piped, "
        "JSON lines (each with the process that wrote it). Lines that are not whole events "
        "(a crash cut them) are skipped and counted.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="log files, or directories of them (a run directory: its logs/ folder)",
    )
    parser.add_argument("--round", type=int, metavar="N", help="only events of round N")
    parser.add_argument(
        "--client",
        metavar="ID",
        help="only events about client ID (its client_id or client field, or its own log)",
    )
    parser.add_argument(
        "--instance",
        metavar="ID",
        help="only events of the run instance ID, or of the one its first characters name "
        "(a run id started again with --clear-run is a new instance; each process tags its "
        "lines once it knows the instance)",
    )
    parser.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="GLOB",
        help="only events whose name matches GLOB, e.g. 'upload.*' (repeatable: any of them)",
    )
    parser.add_argument(
        "--level",
        choices=list(LEVELS),
        default="info",
        help="the lowest level shown (default info: debug lines, such as every accepted upload, on asking)",
    )
    parser.add_argument(
        "-n",
        "--lines",
        type=int,
        metavar="N",
        help="only the last N events of what the logs hold now (then, with --follow, "
        "every new one)",
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="go on showing events as they are written, also of log files that appear "
        "later, until Ctrl-C",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="JSON lines, also on a terminal")
    output.add_argument("--text", action="store_true", help="readable lines, also when piped")
    parser.set_defaults(func=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    from mqttfl.monitor.logtext import TextLines, json_line

    if args.lines is not None and args.lines < 0:
        raise UsageError(f"--lines {args.lines}: must be 0 or more")
    sources = LogSources(args.paths)
    if not args.follow:
        sources.check_some()
    if args.instance is not None and not args.instance.strip():
        raise UsageError("--instance: give the instance's id, or its first characters")
    keep = EventFilter(
        round=args.round,
        client=args.client,
        events=tuple(args.event),
        level=args.level,
        instance=args.instance,
    )
    terminal = sys.stdout.isatty()
    render: Callable[[Event], str]
    if args.json or not (terminal or args.text):
        render = json_line
    else:
        colour = terminal and not os.environ.get("NO_COLOR")
        width = max((len(f.process) for f in sources.files), default=0)
        render = TextLines(colour=colour, width=max(width, 12))
    try:
        show(sources, keep, render, sys.stdout, last=args.lines, following=args.follow)
    except KeyboardInterrupt:  # how --follow ends
        pass
    except BrokenPipeError:  # piped into `head`, which has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    skipped = sources.skipped()
    if skipped:
        where = ", ".join(f"{name}: {count}" for name, count in skipped.items())
        sys.stderr.write(
            f"mqttfl logs: skipped {sum(skipped.values())} lines that are not whole log "
            f"events ({where})\n"
        )
    return 0
