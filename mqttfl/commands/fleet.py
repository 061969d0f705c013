"""``mqttfl fleet``: many client devices in one process."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mqttfl.commands.common import (
    add_config_args,
    add_many_clients_args,
    broker_address,
    credentials,
    positive,
    start_process,
)
from mqttfl.commands.run_settings import add_run_args, local_config, run_config


def add_fleet_command(subparsers: Any) -> None:
    fleet = subparsers.add_parser("fleet", help="run many client devices in one process")
    add_config_args(fleet)
    add_run_args(fleet)
    add_many_clients_args(fleet)
    fleet.add_argument(
        "--workers",
        type=positive,
        help="threads that train and evaluate, one client at a time each (default: cores)",
    )
    fleet.set_defaults(func=cmd_fleet)


def cmd_fleet(args: argparse.Namespace) -> int:
    local = local_config(args)
    broker = broker_address(args)
    from mqttfl.nodes.fleet import check_ids, log_name, parse_ids, run_fleet, runner_credentials

    ids = parse_ids(args.ids)
    identities = runner_credentials(credentials(local), ids, args.credentials_dir)
    start_process(local, log_name(ids))
    config = run_config(
        args, local, broker, identities[ids[0]], state_dir=args.state_dir, client_id=ids[0]
    )
    check_ids(config, ids)
    failed = run_fleet(
        config,
        broker,
        ids,
        state_dir=args.state_dir,
        credentials=identities,
        workers=args.workers,
    )
    if failed:
        first = next(iter(failed))
        sys.stderr.write(
            f"mqttfl: fleet: {len(failed)} of {len(ids)} clients failed "
            f"(client {first}: {failed[first]})\n"
        )
        return 1
    return 0
