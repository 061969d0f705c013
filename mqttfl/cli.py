"""The `mqttfl` command line. User errors print one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mqttfl.compare import add_compare_command
from mqttfl.config import RunConfig, load_config
from mqttfl.data.data_cli import add_data_commands
from mqttfl.errors import BrokerError, MqttflError
from mqttfl.logs import configure_logging, get_logger
from mqttfl.paths import make_dir
from mqttfl.report import add_report_command
from mqttfl.runtime.security import add_broker_commands
from mqttfl.watch import add_watch_command

if TYPE_CHECKING:
    from mqttfl.runtime.transport import BrokerAddress

RESOLVE_TIMEOUT_S = 10.0


def _add_config_args(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
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
    parser.add_argument("--broker", help="broker URL, e.g. mqtt://host:1883")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqttfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a whole local federation (broker, coordinator, clients)")
    _add_config_args(run, positional=True)
    run.add_argument("--out", type=Path, help="run directory (default runs/<run_id>-<time>)")
    run.add_argument(
        "--fleets",
        type=_positive,
        metavar="K",
        help="run the clients in K fleet processes (contiguous id blocks) instead of one "
        "process per client",
    )
    run.add_argument(
        "--no-local-reference",
        action="store_true",
        help="skip the Local reference (each client trained alone, cached after the first "
        "run) that the result table compares every client's accuracy with",
    )
    run.set_defaults(func=cmd_run)

    coord = sub.add_parser("coordinator", help="run the coordinator against a broker")
    _add_config_args(coord)
    coord.add_argument(
        "--out", type=Path, required=True, help="run directory (resumes if it has a checkpoint)"
    )
    coord.set_defaults(func=cmd_coordinator)

    client = sub.add_parser("client", help="run one client device against a broker")
    _add_config_args(client)
    client.add_argument("--id", required=True, help="client id (picks the synthetic room)")
    client.add_argument("--data", type=Path, help="a prepared shard directory (overrides [data])")
    client.add_argument(
        "--state-dir",
        type=Path,
        default=Path("client-state"),
        help="where the client keeps its model between restarts",
    )
    client.set_defaults(func=cmd_client)

    fleet = sub.add_parser("fleet", help="run many client devices in one process")
    _add_config_args(fleet)
    fleet.add_argument("--ids", required=True, help="client ids: ranges and lists, e.g. 0-9,12")
    fleet.add_argument(
        "--state-dir",
        type=Path,
        default=Path("client-state"),
        help="where the clients keep their models between restarts",
    )
    fleet.add_argument(
        "--workers",
        type=_positive,
        help="threads that train and evaluate, one client at a time each (default: cores)",
    )
    fleet.add_argument(
        "--credentials-dir",
        type=Path,
        help="a directory of <id>.env files, one identity per client (as `broker init` "
        "writes them in credentials/); default: the config's credentials for all",
    )
    fleet.set_defaults(func=cmd_fleet)

    models = sub.add_parser("models", help="list models with parameter counts and FLOPs")
    models.add_argument("--num-classes", type=int, default=21)
    models.add_argument("--input", default="64x64", help="input HxW, e.g. 1000x242")
    models.add_argument("--embed-dim", type=int, default=256)
    models.add_argument("--json", action="store_true")
    models.set_defaults(func=cmd_models)

    add_data_commands(sub)
    add_compare_command(sub)
    add_report_command(sub)
    add_broker_commands(sub)
    add_watch_command(sub)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _log_file(name: str, out: Path | None) -> Path:
    base = Path(os.environ.get("MQTTFL_LOG_DIR") or (out / "logs" if out else "logs"))
    return base / f"{name}.jsonl"


def _setup_logging(config: RunConfig, name: str, out: Path | None) -> None:
    # The JSON file keeps everything (every accepted upload is accounted for there);
    # the console shows the configured level, or what `mqttfl run` asks for.
    configure_logging(
        _log_file(name, out),
        level="debug",
        console_level=os.environ.get("MQTTFL_CONSOLE_LEVEL") or config.logging.level,
    )


def _watch_parent() -> None:
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


def _resolve(host: str, port: int, *, timeout: float) -> str | None:
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


def _broker_url(text: str) -> str:
    """Check a ``--broker`` URL (scheme, host, port 1-65535, the host resolves) and
    return it as ``mqtt[s]://host:port``; raise :class:`MqttflError` naming it otherwise."""
    from mqttfl.runtime.transport import BrokerAddress

    try:
        address = BrokerAddress.parse(text)
    except BrokerError as exc:
        raise MqttflError(f"--broker {text!r}: {exc}, e.g. mqtt://127.0.0.1:1883") from None
    problem = _resolve(address.host, address.port, timeout=RESOLVE_TIMEOUT_S)
    if problem is not None:
        raise MqttflError(f"--broker {text!r}: cannot resolve host {address.host!r}: {problem}")
    return str(address)


def _broker(args: argparse.Namespace) -> BrokerAddress:
    from mqttfl.runtime.transport import BrokerAddress

    if not args.broker:
        raise MqttflError("--broker is required, e.g. --broker mqtt://127.0.0.1:1883")
    return BrokerAddress.parse(_broker_url(args.broker))


def _credentials(config: RunConfig):  # noqa: ANN202
    from mqttfl.runtime.transport import Credentials

    b = config.broker
    return Credentials(b.username, b.password, b.tls_ca, b.tls_cert, b.tls_key)


def cmd_run(args: argparse.Namespace) -> int:
    from mqttfl.runtime.launcher import LocalFederation, default_out_dir, format_table

    config = load_config(args.config, args.overrides)
    from mqttfl.algorithms import check_models, make_context

    make_context(config)  # fail on a bad [method] table before starting anything
    check_models(config)
    # Check --broker here, once, rather than in each of the children it is passed to.
    broker = _broker_url(args.broker) if args.broker else None
    out = make_dir(args.out or default_out_dir(config), what="--out")
    configure_logging(out / "logs" / "launcher.jsonl", level=config.logging.level)
    federation = LocalFederation(
        config, args.config, args.overrides, out, broker, fleets=args.fleets
    )
    summary = federation.run()
    if config.method != "local" and not args.no_local_reference:
        from mqttfl.reference import add_local_reference

        try:
            summary = add_local_reference(config, summary, out)
        except Exception as exc:  # noqa: BLE001 - the federation's own result still stands
            get_logger().warning("reference.failed", error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(format_table(summary) + f"\nrun directory: {out}\n")
    return 0


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    broker = _broker(args)
    make_dir(args.out, what="--out")
    from mqttfl.runtime.coordinator import Coordinator  # torch: after the quick checks

    _setup_logging(config, "coordinator", args.out)
    _watch_parent()
    coordinator = Coordinator(config, broker, args.out, credentials=_credentials(config))
    asyncio.run(coordinator.run())
    return 0


def cmd_client(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    broker = _broker(args)
    from mqttfl.data.sources import load_client_shard
    from mqttfl.runtime.client import ClientRunner

    _setup_logging(config, f"client-{args.id}", None)
    _watch_parent()
    shard = load_client_shard(
        config.data,
        args.id,
        seed=config.seed,
        num_classes=config.model.num_classes,
        num_clients=config.federation.num_clients,
        shard_dir=args.data,
    )
    runner = ClientRunner(
        config,
        args.id,
        broker,
        shard,
        state_dir=args.state_dir,
        credentials=_credentials(config),
    )
    return asyncio.run(runner.run())


def cmd_fleet(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    broker = _broker(args)
    from mqttfl.runtime.fleet import check_ids, log_name, parse_ids, run_fleet, runner_credentials

    ids = parse_ids(args.ids)
    check_ids(config, ids)
    credentials = runner_credentials(_credentials(config), ids, args.credentials_dir)
    _setup_logging(config, log_name(ids), None)
    _watch_parent()
    failed = run_fleet(
        config,
        broker,
        ids,
        state_dir=args.state_dir,
        credentials=credentials,
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


def cmd_models(args: argparse.Namespace) -> int:
    from mqttfl.models.flops import describe_models

    try:
        height, width = (int(v) for v in args.input.lower().split("x"))
    except ValueError:
        raise MqttflError(
            f"--input must look like HxW, e.g. 1000x242, got {args.input!r}"
        ) from None
    rows = describe_models(args.num_classes, (height, width), embed_dim=args.embed_dim)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    sys.stdout.write(f"{'model':<12} {'class':<18} {'parameters':>12} {'MFLOPs':>10}  input\n")
    for row in rows:
        sys.stdout.write(
            f"{row['name']:<12} {row['class']:<18} {row['parameters']:>12,} "
            f"{row['flops'] / 1e6:>10.2f}  {'x'.join(map(str, row['input_shape']))}\n"
        )
    return 0


def first_mqttfl_error(group: BaseExceptionGroup[BaseException]) -> MqttflError | None:
    """The first :class:`MqttflError` among the leaves of ``group`` (depth first), or None.

    ``asyncio.TaskGroup`` wraps what its tasks raise in an ``ExceptionGroup``; the user
    error inside is what the command line reports.
    """
    for exc in group.exceptions:
        if isinstance(exc, MqttflError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = first_mqttfl_error(exc)
            if found is not None:
                return found
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except MqttflError as exc:
        sys.stderr.write(f"mqttfl: error: {exc}\n")
        return 2
    except BaseExceptionGroup as group:
        error = first_mqttfl_error(group)
        if error is None:
            raise
        sys.stderr.write(f"mqttfl: error: {error}\n")
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("mqttfl: interrupted\n")
        return 130
