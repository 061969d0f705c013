"""``mqttfl coordinator``: the coordinator of one run, against a broker."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttfl.commands.common import (
    add_config_args,
    broker_address,
    credentials,
    setup_logging,
    watch_parent,
)
from mqttfl.config import RunConfig, load_config
from mqttfl.logs import get_logger
from mqttfl.paths import make_dir

if TYPE_CHECKING:
    from mqttfl.engine.documents import RunSummary


def add_coordinator_command(subparsers: Any) -> None:
    coord = subparsers.add_parser(
        "coordinator",
        help="run the coordinator against a broker",
        description="Run the coordinator of one run against a broker. It ends with the "
        "result table of `mqttfl run`. Logs go to OUT/logs/coordinator.jsonl "
        "(MQTTFL_LOG_DIR overrides); the checkpoint, metrics.jsonl and summary.json to OUT.",
    )
    add_config_args(coord)
    coord.add_argument(
        "--out", type=Path, required=True, help="run directory (resumes if it has a checkpoint)"
    )
    coord.add_argument(
        "--clear-run",
        action="store_true",
        help="start the run id afresh: clear the retained messages a finished or abandoned "
        "run left on the broker under this run id (never while its coordinator is live)",
    )
    coord.add_argument(
        "--local-reference",
        action="store_true",
        help="train the Local reference (each client alone) for the result table if it is "
        "not cached yet; without it the table shows a cached one only",
    )
    coord.set_defaults(func=cmd_coordinator)


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    broker = broker_address(args)
    make_dir(args.out, what="--out")
    _check_shapes(config)
    from mqttfl.engine.journal import Journal
    from mqttfl.engine.state import check_resume
    from mqttfl.nodes.run_lease import claim_run

    setup_logging(config, "coordinator", args.out)
    watch_parent()
    identity = credentials(config, "coordinator")
    # Everything --out holds is read (and found usable) before the broker is touched, so
    # --clear-run never clears a run it then cannot start; nothing in --out changes until
    # the run is ours.
    resume = check_resume(Journal(args.out), config)
    asyncio.run(claim_run(config, broker, args.out, credentials=identity, clear=args.clear_run))
    from mqttfl.nodes.coordinator import Coordinator

    coordinator = Coordinator(
        config,
        broker,
        args.out,
        credentials=identity,
        fresh_session=args.clear_run,
        resume=resume,
    )
    summary = asyncio.run(coordinator.run())
    if summary and not os.environ.get("MQTTFL_PARENT_PID"):  # `mqttfl run` prints its own
        _print_table(config, summary, args.out, train=args.local_reference)
    return 0


def _check_shapes(config: RunConfig) -> None:
    """Where this machine holds the clients' data, check that each model takes it before
    round 1 (the clients check their own shards too; the coordinator also refuses an
    announcement whose model cannot take its announced sample shape)."""
    from mqttfl.data.shapes import sample_shape_problem
    from mqttfl.errors import ConfigError, DataError

    try:
        problem = sample_shape_problem(config)
    except DataError:
        return  # the shards live on the devices
    if problem is not None:
        key = "model.per_client" if config.model.per_client else "model.name"
        raise ConfigError(key, problem)


def _print_table(config: RunConfig, summary: RunSummary, out: Path, *, train: bool) -> None:
    from mqttfl.evaluation.reference import add_local_reference
    from mqttfl.evaluation.table import format_table

    if config.method != "local":
        try:
            summary = add_local_reference(config, summary, out, train=train)
        except Exception as exc:
            get_logger().warning("reference.failed", error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(format_table(summary) + f"\nrun directory: {out}\n")
