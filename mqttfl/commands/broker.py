"""``mqttfl broker init``: write a locked-down Mosquitto's files for one deployment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mqttfl.bus.address import BrokerAddress
from mqttfl.config import load_config
from mqttfl.data.sources import client_id_problem
from mqttfl.errors import FileError, UsageError
from mqttfl.provisioning.broker_init import (
    DEFAULT_MAX_PACKET,
    WATCH,
    client_ids,
    init_broker,
    read_env_file,
    watcher_names,
)
from mqttfl.provisioning.sensors import sensor_names
from mqttfl.provisioning.sites import EdgeBridge, parse_bridges
from mqttfl.wire.control import COORDINATOR
from mqttfl.wire.ids import is_numeric_id


def add_broker_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    broker = subparsers.add_parser("broker", help="set up a secured Mosquitto for a deployment")
    commands = broker.add_subparsers(dest="broker_command", required=True)
    init = commands.add_parser(
        "init", help="write mosquitto.conf, a password file, an ACL (and TLS files)"
    )
    who = init.add_mutually_exclusive_group(required=True)
    who.add_argument("--clients", type=int, help="client identities 0..N-1")
    who.add_argument("--ids", help="client identities, comma-separated")
    init.add_argument("--out", type=Path, required=True, help="directory for the broker files")
    init.add_argument(
        "--config",
        help="run config the clients will use: refuse ids its data source cannot serve "
        "(synthetic, espectre, digits and mnist pick a client's data by its number, so "
        "they need ids 0, 1, ...; only data.source = 'shards' takes names). Without it "
        "the ids are not checked against any config",
    )
    init.add_argument("--run-id", help="limit the ACL to this run (default: any run)")
    init.add_argument("--port", type=int, help="listener port (default 1883, or 8883 with --tls)")
    init.add_argument(
        "--bind", default="127.0.0.1", help="listener address (0.0.0.0 to serve a LAN)"
    )
    init.add_argument("--tls", action="store_true", help="generate a local CA and a TLS listener")
    init.add_argument(
        "--hostname",
        action="append",
        dest="hostnames",
        help="name or IP clients use to reach the broker (repeatable; default localhost, 127.0.0.1)",
    )
    init.add_argument(
        "--max-packet-bytes",
        type=int,
        default=DEFAULT_MAX_PACKET,
        help="publishes above this size disconnect their sender",
    )
    init.add_argument(
        "--force", action="store_true", help="replace an existing setup and its credentials"
    )
    init.add_argument(
        "--bridge",
        action="append",
        default=[],
        metavar="SITE=IDS",
        help="central broker: let site SITE's edge broker bridge in for clients IDS "
        "(repeatable; writes credentials/site-SITE.env for the edge)",
    )
    init.add_argument(
        "--sensors",
        metavar="NAMES",
        help="sensing devices, comma-separated: credentials/sensor-NAME.env for `mqttfl "
        "sense --name NAME` (it may publish only its own readings) and gateway-NAME.env "
        "for what feeds it frames on csi/NAME",
    )
    init.add_argument(
        "--watchers",
        metavar="NAMES",
        help="more read-only identities besides 'watch', comma-separated: "
        "credentials/watch-NAME.env each",
    )
    init.add_argument("--site", help="write an edge broker for this site, bridged to --central")
    init.add_argument("--central", help="with --site: the central broker's URL")
    init.add_argument(
        "--bridge-credentials",
        type=Path,
        help="with --site: the central setup's credentials/site-SITE.env",
    )
    init.set_defaults(func=cmd_broker_init)


def check_ids_for_config(clients: list[str], config_path: str) -> str:
    """Refuse client ids the run config's data source cannot give data to; return a
    warning when the ids do not cover the config's clients (or "")."""
    config = load_config(config_path)
    wanted = config.federation.num_clients
    for client in clients:
        problem = client_id_problem(config.data, client, num_clients=wanted)
        if problem is not None:
            raise UsageError(f"{config_path}: {problem}")
    expected = [str(i) for i in range(wanted)]
    if all(is_numeric_id(c) for c in clients):
        uncovered = [c for c in expected if c not in clients]
    else:
        uncovered = expected[len(clients) :]  # named shards: only the count can be checked
    if not uncovered:
        return ""
    shown = ", ".join(uncovered[:10]) + (" ..." if len(uncovered) > 10 else "")
    return (
        f"mqttfl: warning: {config_path} has federation.num_clients = {wanted}, but these "
        f"{len(clients)} ids leave {len(uncovered)} without a login ({shown}); the "
        f"coordinator would wait for them: use --clients {wanted} (and --force), or lower "
        "federation.num_clients\n"
    )


def cmd_broker_init(args: argparse.Namespace) -> int:
    clients = client_ids(clients=args.clients, ids=args.ids)
    sensors = sensor_names(args.sensors)
    watchers = watcher_names(args.watchers)
    warning = check_ids_for_config(clients, args.config) if args.config else ""
    edge = _edge_bridge(args)
    setup = init_broker(
        args.out,
        clients,
        run_id=args.run_id,
        port=args.port,
        bind=args.bind,
        tls=args.tls,
        hostnames=args.hostnames,
        max_packet_bytes=args.max_packet_bytes,
        force=args.force,
        bridges=parse_bridges(args.bridge),
        edge=edge,
        unprivileged=True,
        sensors=sensors,
        watchers=watchers,
    )
    sys.stdout.write(
        f"broker files in {setup.out} ({len(clients)} clients + {COORDINATOR} + {WATCH})\n"
        f"  start:  mosquitto -c {setup.conf}\n"
        f"  use:    set -a; . {setup.env_file(COORDINATOR)}; set +a; "
        f"mqttfl coordinator --broker {setup.url} ...\n"
        f"  client: set -a; . {setup.out / 'credentials'}/<id>.env; set +a; "
        f"mqttfl client --id <id> --broker {setup.url} ...\n"
        "  each device sources its own id's file only; keep those files private\n"
        f"  watch:  credentials/{WATCH}.env, then mqttfl watch --broker {setup.url} --run RUN\n"
    )
    if watchers:
        files = ", ".join(f"credentials/{w}.env" for w in watchers)
        sys.stdout.write(f"  more watchers: {files}\n")
    if sensors:
        sys.stdout.write(
            f"  sensor: set -a; . ./sensor-<name>.env; set +a; mqttfl sense EXPORT --name "
            f"<name> --input mqtt:csi/<name> --broker {setup.url}\n"
            f"          for {', '.join(sensors)}; its gateway publishes to csi/<name> with "
            "credentials/gateway-<name>.env\n"
        )
    if setup.run_as and setup.run_as != "root":
        sys.stdout.write(f"  mosquitto started as root drops to user {setup.run_as!r}\n")
    if setup.note:
        sys.stdout.write(f"  note: {setup.note}\n")
    sys.stderr.write(warning)
    named = [c for c in clients if not is_numeric_id(c)]
    if named and not args.config:
        sys.stdout.write(
            f"  note: ids {', '.join(named)} are not numbers: only runs with "
            "data.source = 'shards' can use them (--config CONFIG checks a config)\n"
        )
    return 0


def _edge_bridge(args: argparse.Namespace) -> EdgeBridge | None:
    if args.site is None:
        if args.central or args.bridge_credentials:
            raise UsageError("--central and --bridge-credentials go with --site")
        return None
    if not args.central or not args.bridge_credentials:
        raise UsageError("--site needs --central URL and --bridge-credentials FILE")
    central = BrokerAddress.parse(args.central)
    if not args.bridge_credentials.is_file():
        raise FileError(f"{args.bridge_credentials}: file not found")
    env = read_env_file(args.bridge_credentials)
    return EdgeBridge.from_env(
        args.site, central.host, central.port, env, source=args.bridge_credentials
    )
