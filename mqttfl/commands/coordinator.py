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
    check_shapes,
    credentials,
    setup_logging,
    start_process,
)
from mqttfl.config import RunConfig, load_config
from mqttfl.errors import StateError, UsageError
from mqttfl.files import set_aside_dir
from mqttfl.logs import get_logger
from mqttfl.paths import LOCK_FILE, RunLock, check_set_aside, claim_run_dir

if TYPE_CHECKING:
    from mqttfl.engine.documents import RunSummary
    from mqttfl.engine.state import Resume


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
        "run left on the broker under this run id (never while its coordinator is live), "
        "and set what --out holds aside, renamed to OUT.previous-<time> (nothing is "
        "deleted); the run id stays, so a broker ACL from `broker init --run-id` still fits",
    )
    coord.add_argument(
        "--local-reference",
        action="store_true",
        help="train the Local reference (each client alone) for the result table if it is "
        "not cached yet; without it the table shows a cached one only",
    )
    coord.set_defaults(func=cmd_coordinator)


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = _config(args)
    broker = broker_address(args)
    if args.clear_run:
        check_set_aside(args.out, what="--out")
    lock = claim_run_dir(args.out, what="--out")  # or the one `mqttfl run` passed down
    check_shapes(config)
    from mqttfl.nodes.run_lease import claim_run

    # before our log lands in it
    earlier = args.clear_run and any(p.name != LOCK_FILE for p in args.out.iterdir())
    start_process(config, "coordinator", args.out)
    identity = credentials(config, "coordinator")
    # Everything --out holds is read (and found usable) before the broker is touched, and
    # nothing in --out changes until the run is ours. With --clear-run none of it is read:
    # it is set aside once the run is claimed and its retained messages are cleared.
    resume = None if args.clear_run else _resume(config, args.out)
    asyncio.run(claim_run(config, broker, credentials=identity, clear=args.clear_run))
    if earlier:
        lock = _start_afresh(config, args.out, lock)
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


def _config(args: argparse.Namespace) -> RunConfig:
    """The config: --config and --set; or, resuming a run dir without --config, the run's
    own manifest kept there (--set may then name only what is not the run's)."""
    if args.config is not None or args.clear_run:
        return load_config(args.config, args.overrides)
    from mqttfl.nodes.manifest import MANIFEST_FILE, device_config, read_copy

    kept = args.out / MANIFEST_FILE
    if not kept.is_file():
        raise UsageError(
            f"--config is required: {kept} does not exist (a run directory resumes without "
            "--config from the manifest its coordinator kept there)"
        )
    local = load_config(None, args.overrides)
    return device_config(read_copy(kept), local, from_file=False, overrides=args.overrides)


def _resume(config: RunConfig, out: Path) -> Resume:
    """Where the run in ``out`` goes on from; a run dir it cannot go on from is one line
    that also names the way to start afresh."""
    from mqttfl.engine.journal import Journal
    from mqttfl.engine.state import check_resume

    try:
        return check_resume(Journal(out), config)
    except StateError as exc:
        raise StateError(
            f"{exc}; or start the run afresh with --clear-run, which sets what --out holds aside"
        ) from None


def _start_afresh(config: RunConfig, out: Path, lock: RunLock) -> RunLock:
    """Set the earlier run's files aside, and start this run's log in the emptied ``out``
    (what this process logged until now, clearing that run, stays with it). The lock
    file went aside with them: ``out`` is locked again, and the lock returned."""
    kept = set_aside_dir(out, what="--out")
    held = claim_run_dir(out, what="--out")
    os.close(lock.fd)
    setup_logging(config, "coordinator", out)
    get_logger(run_id=config.run_id, client_id="coordinator").warning(
        "run.set_aside", out=str(out), kept_as=None if kept is None else str(kept)
    )
    return held


def _print_table(config: RunConfig, summary: RunSummary, out: Path, *, train: bool) -> None:
    from mqttfl.evaluation.reference import add_local_reference
    from mqttfl.evaluation.table import format_table

    if config.method != "local":
        try:
            summary = add_local_reference(config, summary, out, train=train)
        except Exception as exc:
            get_logger().warning("reference.failed", error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(format_table(summary) + f"\nrun directory: {out}\n")
