"""``mqttfl run``: a whole local federation (broker, coordinator, clients) and its table.

On a terminal it draws the live view of `mqttfl watch` while the federation runs, then a
progress bar for the Local reference (:mod:`mqttfl.monitor.progress`); piped or with
``--plain`` it writes one line per round. The structlog records of every process go to
``<run>/logs/*.jsonl`` only; ``-v`` brings them back to the console (stderr).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttfl.commands.common import add_config_args, broker_url, positive
from mqttfl.config import load_config
from mqttfl.logs import configure_logging, get_logger
from mqttfl.monitor.buffered import buffer_watch
from mqttfl.paths import claim_run_dir
from mqttfl.privacy.accountant import privacy_settings

if TYPE_CHECKING:
    from rich.console import Console

    from mqttfl.bus.address import BrokerAddress, Credentials
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard


def add_run_command(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run", help="run a whole local federation (broker, coordinator, clients)"
    )
    add_config_args(run, positional=True)
    run.add_argument("--out", type=Path, help="run directory (default runs/<run_id>-<time>)")
    run.add_argument(
        "--fleets",
        type=positive,
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
    run.add_argument(
        "--plain",
        action="store_true",
        help="one line per round instead of the live view (the default when not on a terminal)",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show every process's log records on the console (they always go to "
        "<run>/logs/*.jsonl)",
    )
    run.set_defaults(func=cmd_run)


def _monitor_factory(
    config: RunConfig, console: Console, live: bool
) -> Callable[[BrokerAddress, Credentials], AbstractContextManager[object]]:
    from mqttfl.monitor.progress import RunMonitor
    from mqttfl.monitor.view import FederationView

    def monitor(address: BrokerAddress, credentials: Credentials) -> RunMonitor:
        view = FederationView(
            config.run_id,
            max_upload_bytes=config.federation.max_upload_bytes,
            privacy=privacy_settings(config),
            buffer=buffer_watch(config),
        )
        return RunMonitor(
            view,
            address,
            credentials,
            rounds=config.rounds,
            console=console,
            live=live,
            keepalive_s=config.broker.keepalive_s,
        )

    return monitor


def cmd_run(args: argparse.Namespace) -> int:
    from mqttfl.algorithms import check_models, make_context
    from mqttfl.data.shapes import check_sample_shapes
    from mqttfl.evaluation.table import format_table
    from mqttfl.launch.local import LocalFederation, default_out_dir
    from mqttfl.monitor.progress import ReferenceProgress, console_for

    config = load_config(args.config, args.overrides)
    make_context(config)  # fail on a bad [method] table before starting anything
    check_models(config)
    check_sample_shapes(config)  # every client's model takes its shard's samples
    # Check --broker here, once, rather than in each of the children it is passed to.
    broker = broker_url(args.broker) if args.broker else None
    out = args.out or default_out_dir(config)
    # Before anything is written there; the coordinator inherits it.
    lock = claim_run_dir(out, what="--out")
    console, live = console_for(sys.stdout, plain=args.plain)
    configure_logging(
        out / "logs" / "launcher.jsonl",
        level=config.logging.level,
        console_level=None if args.verbose else "off",
    )
    sys.stdout.write(
        f"{config.method} on {config.federation.num_clients} clients, {config.rounds} rounds, "
        f"{config.data.split} split; run directory {out} (logs in {out / 'logs'})\n"
    )
    sys.stdout.flush()
    federation = LocalFederation(
        config,
        args.config,
        args.overrides,
        out,
        broker,
        fleets=args.fleets,
        coordinator_console="info" if args.verbose else "off",
        client_console="warning" if args.verbose else "off",
        monitor=_monitor_factory(config, console, live),
        lock=lock,
    )
    reference = config.method != "local" and not args.no_local_reference
    # The reference's shards are made while the federation runs, in the gaps its
    # processes leave (joining, aggregating); the reference itself trains after it.
    shards = _ShardLoader(config) if reference else None
    summary = federation.run()  # on an error the loader, a daemon thread, goes with us
    if shards is not None:
        from mqttfl.evaluation.reference import add_local_reference

        def progress(clients: int, rounds: int) -> ReferenceProgress:
            return ReferenceProgress(clients, rounds, console=console, live=live)

        try:
            summary = add_local_reference(
                config, summary, out, progress=progress, shards=shards.result()
            )
        except Exception as exc:
            get_logger().warning("reference.failed", error=f"{type(exc).__name__}: {exc}")
            sys.stdout.write(f"local reference failed ({type(exc).__name__}: {exc})\n")
    sys.stdout.write(format_table(summary) + f"\nrun directory: {out}\n")
    return 0


class _ShardLoader:
    """Every client's shard (as the launcher's clients load theirs), made in a thread."""

    def __init__(self, config: RunConfig) -> None:
        self._config = config
        self._shards: dict[str, Shard] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, name="mqttfl-shards", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        from mqttfl.evaluation.pooled import client_shards

        try:
            self._shards = client_shards(self._config)
        except BaseException as exc:
            self._error = exc

    def result(self) -> dict[str, Shard]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._shards is not None
        return self._shards
