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
from mqttfl.config import RunConfig, load_config
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
    _check_shapes(config)
    from mqttfl.nodes.coordinator import Coordinator  # torch: after the quick checks

    setup_logging(config, "coordinator", args.out)
    watch_parent()
    coordinator = Coordinator(config, broker, args.out, credentials=credentials(config))
    asyncio.run(coordinator.run())
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
