"""``mqttfl client``: one client device against a broker."""

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
from mqttfl.errors import MqttflError


def add_client_command(subparsers: Any) -> None:
    client = subparsers.add_parser(
        "client",
        help="run one client device against a broker",
        description="Run one client device against a broker. Its credentials come from "
        "MQTTFL_BROKER__USERNAME/__PASSWORD: `set -a; . credentials/<id>.env; set +a` with "
        "the file `mqttfl broker init` wrote for this id. It writes its log to "
        "./logs/client-<id>.jsonl (MQTTFL_LOG_DIR overrides) and its state to "
        "./client-state/ (--state-dir), both under the folder it is started from.",
    )
    add_config_args(client)
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
    config = load_config(args.config, args.overrides)
    broker = broker_address(args)
    from mqttfl.data.sources import load_client_shard
    from mqttfl.nodes.client import ClientRunner

    setup_logging(config, f"client-{args.id}", None)
    watch_parent()
    shard = load_client_shard(
        config.data,
        args.id,
        seed=config.seed,
        num_classes=config.model.num_classes,
        num_clients=config.federation.num_clients,
        shard_dir=args.data,
    )
    try:
        runner = ClientRunner(
            config,
            args.id,
            broker,
            shard,
            state_dir=args.state_dir,
            credentials=credentials(config, args.id),
        )
    except MqttflError:
        raise
    except Exception as exc:
        saved = (
            sorted(str(p) for p in args.state_dir.glob(f"*{args.id}*"))
            if args.state_dir.is_dir()
            else []
        )
        where = f"; --state-dir {args.state_dir} holds {', '.join(saved)[:200]}" if saved else ""
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise MqttflError(
            f"client {args.id!r} could not start ({type(exc).__name__}: {detail}){where}: "
            "state saved by another config or run? Move it aside or give this run its own "
            "--state-dir"
        ) from None
    return asyncio.run(runner.run())
