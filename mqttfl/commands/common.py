"""What several commands share: config arguments, --broker checks, credentials, logging."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.errors import BrokerError, UsageError, WireError
from mqttfl.logs import configure_logging
from mqttfl.wire.ids import check_id

if TYPE_CHECKING:
    from mqttfl.config import RunConfig

RESOLVE_TIMEOUT_S = 10.0


def add_config_args(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
    """The config (positional or ``--config``), ``--set`` overrides and ``--broker``."""
    if positional:
        parser.add_argument("config", help="run config (TOML)")
    else:
        parser.add_argument("--config", help="run config (TOML)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set federation.num_clients=4",
    )
    parser.add_argument(
        "--broker",
        help="broker URL, e.g. mqtt://host:1883 (mqtts:// for TLS; without a scheme, mqtt://)",
    )


def positive(text: str) -> int:
    """An argparse type: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def log_file(name: str, out: Path | None) -> Path:
    base = Path(os.environ.get("MQTTFL_LOG_DIR") or (out / "logs" if out else "logs"))
    return base / f"{name}.jsonl"


def setup_logging(config: RunConfig, name: str, out: Path | None) -> None:
    """A process's JSON-lines file keeps everything (every accepted upload is accounted
    for there); the console shows the configured level, or what `mqttfl run` asks for."""
    configure_logging(
        log_file(name, out),
        level="debug",
        console_level=os.environ.get("MQTTFL_CONSOLE_LEVEL") or config.logging.level,
    )


def start_process(
    config: RunConfig, name: str, out: Path | None = None, *, watched: bool = True
) -> None:
    """What each process of a run does once it has its config: its log file ``name``
    (:func:`setup_logging`) and, when `mqttfl run` started it, an exit once the launcher
    is gone (:func:`watch_parent`; ``watched=False`` for a parent that forks, which holds
    no thread while it does)."""
    setup_logging(config, name, out)
    if watched:
        watch_parent()


def watch_parent() -> None:
    """Exit if the `mqttfl run` that started us is gone, so nothing is orphaned."""
    parent = os.environ.get("MQTTFL_PARENT_PID")
    if not parent:
        return

    def watch() -> None:
        while True:
            if os.getppid() != int(parent):
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()


def resolve(host: str, port: int, *, timeout: float) -> str | None:
    """Why ``host`` cannot be resolved (within ``timeout`` seconds), or None."""
    problem: list[str | None] = [f"no answer within {timeout:.0f} s"]

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            problem[0] = None
        except (OSError, UnicodeError) as exc:
            problem[0] = getattr(exc, "strerror", None) or str(exc)

    thread = threading.Thread(target=lookup, daemon=True)  # getaddrinfo has no timeout
    thread.start()
    thread.join(timeout)
    return problem[0]


def broker_url(text: str) -> str:
    """Check a ``--broker`` URL (scheme, host, port 1-65535, the host resolves) and
    return it as ``mqtt[s]://host:port``; raise :class:`MqttflError` naming it otherwise."""
    try:
        address = BrokerAddress.parse(text)
    except BrokerError as exc:
        raise UsageError(f"--broker {text!r}: {exc}, e.g. mqtt://127.0.0.1:1883") from None
    problem = resolve(address.host, address.port, timeout=RESOLVE_TIMEOUT_S)
    if problem is not None:
        raise UsageError(f"--broker {text!r}: cannot resolve host {address.host!r}: {problem}")
    if "://" not in text:
        sys.stderr.write(f"mqttfl: note: --broker {text!r} has no scheme: taken as {address}\n")
    return str(address)


def checked_id(value: str, option: str) -> str:
    """A client id given as ``option``, checked (:func:`mqttfl.wire.ids.check_id`)."""
    try:
        return check_id(value)
    except WireError as exc:
        raise UsageError(f"{option}: {exc.detail}") from None


def broker_address(args: argparse.Namespace) -> BrokerAddress:
    """The required ``--broker``, checked."""
    if not args.broker:
        raise UsageError("--broker is required, e.g. --broker mqtt://127.0.0.1:1883")
    return BrokerAddress.parse(broker_url(args.broker))


def credentials(config: RunConfig, identity: str | None = None) -> Credentials:
    """The config's ``[broker]`` identity (``MQTTFL_BROKER__*`` in the environment);
    ``identity`` names the ``credentials/<id>.env`` a refused login points to."""
    b = config.broker
    env = f"credentials/{identity or '<id>'}.env"
    origin = (
        "the user name and password come from MQTTFL_BROKER__USERNAME and "
        f"MQTTFL_BROKER__PASSWORD (or [broker] in the config): on this device run "
        f"`set -a; . {env}; set +a` with the {env} that `mqttfl broker init` wrote"
    )
    return Credentials(b.username, b.password, b.tls_ca, b.tls_cert, b.tls_key, origin)


def add_many_clients_args(parser: argparse.ArgumentParser) -> None:
    """``--ids``, ``--state-dir`` and ``--credentials-dir``: many clients of one machine
    (`mqttfl clients`, `mqttfl fleet`)."""
    parser.add_argument("--ids", required=True, help="client ids: ranges and lists, e.g. 0-9,12")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path("client-state"),
        help="where the clients keep their state between restarts (one file per run id)",
    )
    parser.add_argument(
        "--credentials-dir",
        type=Path,
        help="a directory of <id>.env files, one identity per client (as `broker init` "
        "writes them in credentials/); default: the config's credentials for all",
    )


def check_shapes(config: RunConfig) -> None:
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
