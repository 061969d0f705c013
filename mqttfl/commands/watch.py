"""``mqttfl watch``: a live view of a running federation, read only from the broker."""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

from rich.console import Console

from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus
from mqttfl.commands.common import broker_address, credentials
from mqttfl.config import RunConfig, load_config
from mqttfl.errors import StateError, UsageError, WireError
from mqttfl.logs import configure_logging
from mqttfl.monitor.buffered import buffer_watch
from mqttfl.monitor.live import ONCE_LISTEN_S, run_watch, watch_topics
from mqttfl.monitor.view import FederationView
from mqttfl.privacy.accountant import privacy_settings

MANIFEST_LOOK_S = 3.0  # a live run's manifest is retained: it comes at once


PIPED_WIDTH = 400


def add_watch_command(subparsers: Any) -> None:
    """Register ``mqttfl watch`` on the main parser's subcommands."""
    parser = subparsers.add_parser(
        "watch", help="a live view of a running federation, read only from the broker"
    )
    parser.add_argument("--broker", help="broker URL, e.g. mqtt://host:1883")
    parser.add_argument("--run", required=True, help="the run id (the config's run_id)")
    parser.add_argument(
        "--config",
        help="run config (TOML): its [broker] credentials; the run's other settings come "
        "from the manifest its coordinator publishes, when there is one",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help=f"listen {ONCE_LISTEN_S:.0f} s, print one snapshot and exit",
    )
    parser.set_defaults(func=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    local = load_config(args.config)
    broker = broker_address(args)
    # The bus's reconnect warnings would tear the screen; the view shows the connection.
    configure_logging(None, level="error")
    config = _run_config(args.run, local, broker)
    try:
        view = FederationView(
            args.run,
            max_upload_bytes=config.federation.max_upload_bytes,
            privacy=privacy_settings(config),
            buffer=buffer_watch(config),
        )
    except WireError as exc:
        raise UsageError(f"--run {args.run!r}: {exc.detail}") from None
    bus = Bus(
        broker,
        identifier=f"mqttfl-{args.run}-watch-{secrets.token_hex(4)}",
        subscriptions=watch_topics(view.topics),
        credentials=credentials(config),
        keepalive_s=config.broker.keepalive_s,
        connect_timeout_s=config.broker.connect_timeout_s,
    )
    console = Console()
    if not console.is_terminal:  # piped: a table as wide as it is, never wrapped at 80
        console = Console(width=PIPED_WIDTH)
    asyncio.run(run_watch(view, bus, console, once=args.once))
    if args.once and view.phase == "unknown" and not view.clients:
        raise StateError(
            f"--run {args.run!r}: the broker {broker} holds nothing of this run (no state, "
            f"no client status in {ONCE_LISTEN_S:.0f} s); is the run id right, and has its "
            "coordinator started?"
        )
    return 0


def _run_config(run: str, local: RunConfig, broker: BrokerAddress) -> RunConfig:
    """The run's settings from its manifest (its privacy, buffer and upload bound), with
    this watcher's [broker]; ``local`` as it is where the run has no manifest yet."""
    from mqttfl.nodes.manifest import await_manifest, device_config

    try:
        manifest = asyncio.run(
            await_manifest(
                broker,
                run,
                credentials=credentials(local),
                who=f"run {run!r}'s manifest",
                timeout=MANIFEST_LOOK_S,
                connect_timeout=local.broker.connect_timeout_s,
            )
        )
    except (StateError, WireError):  # no manifest (yet), or a run id that cannot be one
        return local
    return device_config(manifest, local, from_file=False, overrides=[])
