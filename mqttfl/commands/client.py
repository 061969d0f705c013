"""``mqttfl client``: one client device against a broker."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mqttfl.commands.common import (
    add_config_args,
    broker_address,
    checked_id,
    credentials,
    start_process,
)
from mqttfl.commands.run_settings import add_run_args, local_config, run_config


def add_client_command(subparsers: Any) -> None:
    client = subparsers.add_parser(
        "client",
        help="run one client device against a broker",
        description="Run one client device against a broker: `mqttfl client --run ID --id N "
        "--broker URL` takes the run's settings from the manifest its coordinator publishes "
        "(a --config of the device's own is checked against it). Its credentials come from "
        "MQTTFL_BROKER__USERNAME/__PASSWORD: `set -a; . credentials/<id>.env; set +a` with "
        "the file `mqttfl broker init` wrote for this id. It writes its log to "
        "./logs/client-<id>.jsonl (MQTTFL_LOG_DIR overrides) and its state to "
        "./client-state/ (--state-dir), both under the folder it is started from. The "
        "process is named c<id>@<run id> (pgrep -x) and keeps its pid in "
        "<state dir>/<run id>/client-<id>.pid while it runs.",
    )
    add_config_args(client)
    add_run_args(client)
    client.add_argument("--id", required=True, help="client id (picks the synthetic room)")
    client.add_argument("--data", type=Path, help="a prepared shard directory (overrides [data])")
    client.add_argument(
        "--state-dir",
        type=Path,
        default=Path("client-state"),
        help="where the client keeps its state between restarts, one file per run id "
        "(default: ./client-state)",
    )
    client.set_defaults(func=cmd_client)


def cmd_client(args: argparse.Namespace) -> int:
    checked_id(args.id, "--id")  # it names the log file and the state file
    local = local_config(args)
    broker = broker_address(args)
    from mqttfl.nodes.client_process import run_client_device

    start_process(local, f"client-{args.id}")
    identity = credentials(local, args.id)
    shard = None
    if args.config is not None:  # the device's own config: its shard (and its fit) first
        from mqttfl.data.shapes import check_shard_shape
        from mqttfl.data.sources import run_client_shard

        shard = run_client_shard(local, args.id, args.data)
        check_shard_shape(local, args.id, shard)
    config = run_config(args, local, broker, identity, state_dir=args.state_dir, client_id=args.id)
    if config.data != local.data:  # a data key the run lets devices set, not set here
        shard = None
    return run_client_device(
        config,
        args.id,
        broker,
        state_dir=args.state_dir,
        credentials=identity,
        shard_dir=args.data,
        shard=shard,
    )
