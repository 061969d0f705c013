"""``mqttfl clients``: many client devices, one OS process each, forked from one parent."""

from __future__ import annotations

import argparse
from typing import Any

from mqttfl.commands.common import (
    add_config_args,
    add_many_clients_args,
    broker_address,
    credentials,
    log_file,
    start_process,
)
from mqttfl.commands.run_settings import add_run_args, local_config, run_config
from mqttfl.config import RunConfig


def add_clients_command(subparsers: Any) -> None:
    clients = subparsers.add_parser(
        "clients",
        help="run many client devices, one OS process each, forked from one parent",
        description="Run many client devices on this machine, one OS process each (its own "
        "MQTT session, last will, shard, state and log file; `pkill -9 -L -F "
        "STATE_DIR/RUN/client-3.pid` drops one), forked from one parent that imported torch "
        "once, so they share its pages. Each child runs exactly as `mqttfl client --id <id>` "
        "would.",
    )
    add_config_args(clients)
    add_run_args(clients)
    add_many_clients_args(clients)
    clients.set_defaults(func=cmd_clients)


def cmd_clients(args: argparse.Namespace) -> int:
    local = local_config(args)
    broker = broker_address(args)
    from mqttfl.nodes.fleet import check_ids, parse_ids, runner_credentials
    from mqttfl.nodes.forks import Forks

    ids = parse_ids(args.ids)
    identities = runner_credentials(credentials(local), ids, args.credentials_dir)
    name = f"clients-{ids[0]}" if len(ids) == 1 else f"clients-{ids[0]}-{ids[-1]}"
    start_process(local, name, watched=False)  # its forked children watch
    config = run_config(
        args, local, broker, identities[ids[0]], state_dir=args.state_dir, client_id=ids[0]
    )
    check_ids(config, ids)
    forks = Forks(
        config,
        broker,
        ids,
        state_dir=args.state_dir,
        credentials=identities,
        log_dir=log_file(name, None).parent,
        prepare_child=lambda client_id: _prepare_child(config, client_id),
    )
    return forks.run()


def _prepare_child(config: RunConfig, client_id: str) -> None:
    start_process(config, f"client-{client_id}")
