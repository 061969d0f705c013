"""``mqttfl coordinator``: the coordinator of one run, against a broker."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from mqttfl.commands.common import (
    add_config_args,
    broker_address,
    credentials,
    setup_logging,
    watch_parent,
)
from mqttfl.config import load_config
from mqttfl.paths import make_dir


def add_coordinator_command(subparsers: Any) -> None:
    coord = subparsers.add_parser("coordinator", help="run the coordinator against a broker")
    add_config_args(coord)
    coord.add_argument(
        "--out", type=Path, required=True, help="run directory (resumes if it has a checkpoint)"
    )
    coord.set_defaults(func=cmd_coordinator)


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    broker = broker_address(args)
    make_dir(args.out, what="--out")
    from mqttfl.nodes.coordinator import Coordinator  # torch: after the quick checks

    setup_logging(config, "coordinator", args.out)
    watch_parent()
    coordinator = Coordinator(config, broker, args.out, credentials=credentials(config))
    asyncio.run(coordinator.run())
    return 0
