"""What the device commands (``client``, ``clients``, ``fleet``) share: the run's settings,
taken from the manifest its coordinator keeps on the broker.

A device needs ``--run ID`` (or a config naming the run), ``--broker`` and its
credentials; ``--config`` and ``--set`` are for the device's own keys, and are checked
against the run's before the device publishes anything (:mod:`mqttfl.nodes.manifest`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.config import RunConfig, load_config
from mqttfl.errors import UsageError
from mqttfl.logs import get_logger
from mqttfl.wire import Topics

MANIFEST_WAIT_S = 300.0


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run",
        help="the run id to join: its settings come from the manifest its coordinator "
        "publishes (needed without --config)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=MANIFEST_WAIT_S,
        metavar="S",
        help=f"how long to wait for the run's manifest (default: {MANIFEST_WAIT_S:.0f} s)",
    )


def local_config(args: argparse.Namespace) -> RunConfig:
    """The device's own settings: its config file (if any), --set and MQTTFL_* variables,
    with the run id of --run."""
    overrides = list(args.overrides)
    if args.run is not None:
        run = args.run
        if args.config is not None:
            named = load_config(args.config, overrides).run_id
            if named != run:
                raise UsageError(
                    f"--run {run!r} and --config {args.config} (run_id {named!r}) name "
                    "two runs: give one"
                )
        overrides.append(f"run_id={run}")
    elif args.config is None:
        raise UsageError(
            "--run RUN_ID is required without --config: the id of the run to join "
            "(its settings come from its coordinator), e.g. --run fedapa-csi"
        )
    return load_config(args.config, overrides)


def run_config(
    args: argparse.Namespace,
    local: RunConfig,
    broker: BrokerAddress,
    identity: Credentials,
    *,
    state_dir: Path,
    client_id: str,
) -> RunConfig:
    """The run's config for this device, from the run's manifest (a copy kept beside the
    device's state for later readers); one line (exit 2) if the device's own differs."""
    from mqttfl.nodes.manifest import await_manifest, device_config, keep_copy

    if args.wait <= 0:
        raise UsageError(f"--wait {args.wait}: must be a positive number of seconds")
    get_logger(run_id=local.run_id).info("run.joining", broker=str(broker), wait_s=args.wait)
    manifest = asyncio.run(
        await_manifest(
            broker,
            local.run_id,
            credentials=identity,
            who=f"client {client_id!r}",
            timeout=args.wait,
            connect_timeout=local.broker.connect_timeout_s,
            probe=Topics(local.run_id).status(client_id),
        )
    )
    config = device_config(
        manifest, local, from_file=args.config is not None, overrides=args.overrides
    )
    keep = state_dir / config.run_id
    keep.mkdir(parents=True, exist_ok=True)
    keep_copy(manifest, keep)
    return config
