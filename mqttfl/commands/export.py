"""``mqttfl export``: a finished run's client models as ONNX, each with its sensor.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqttfl.errors import FileError, UsageError

if TYPE_CHECKING:
    from mqttfl.export.client import Exported


def add_export_command(subparsers: Any) -> None:
    export = subparsers.add_parser(
        "export",
        help="write a client's evaluation model as ONNX with its sensor.json (for mqttfl sense)",
    )
    export.add_argument(
        "run_dir", type=Path, nargs="?", help="a finished run directory (or --state-dir)"
    )
    export.add_argument(
        "--state-dir",
        type=Path,
        help="on a device: its client state directory (with --run and --client), where "
        "its client keeps the model and the run's manifest",
    )
    export.add_argument("--run", help="the run id, with --state-dir")
    which = export.add_mutually_exclusive_group(required=True)
    which.add_argument("--client", help="the client id to export")
    which.add_argument("--all", action="store_true", help="every client (OUT/client-<id>/)")
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument(
        "--data", type=Path, help="the client's shard directory, when it trained on --data"
    )
    export.add_argument(
        "--with-shard",
        action="store_true",
        help="also write the client's shard as the run built it (OUT/shard), for "
        "mqttfl sense --input shard:OUT/shard --eval",
    )
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from mqttfl.export.client import export_client, in_run_dir, on_device, run_clients, run_summary

    if (args.run_dir is None) == (args.state_dir is None):
        raise UsageError(
            "give a run directory (mqttfl export RUN_DIR ...) or, on a device, "
            "--state-dir DIR --run ID --client N"
        )
    if args.state_dir is not None:
        if args.run is None or args.client is None:
            raise UsageError("--state-dir needs --run ID and --client N (one device's model)")
        source = on_device(args.state_dir, args.run, args.client)
        done = export_client(
            source, args.client, args.out, shard_dir=args.data, with_shard=args.with_shard
        )
        _say(done, args.out)
        return 0
    if args.run is not None:
        raise UsageError("--run goes with --state-dir; a run directory names its run")
    if args.all:
        if args.data is not None:
            raise UsageError("--data names one client's shard; use it with --client")
        clients = run_clients(run_summary(args.run_dir))
        if not clients:
            raise FileError(f"{args.run_dir}: summary.json lists no clients")
        targets = [(c, args.out / f"client-{c}") for c in clients]
    else:
        targets = [(args.client, args.out)]
    for client_id, out in targets:
        source = in_run_dir(args.run_dir, client_id)
        done = export_client(
            source, client_id, out, shard_dir=args.data, with_shard=args.with_shard
        )
        _say(done, out)
    return 0


def _say(done: Exported, out: Path) -> None:
    run, scores = done.spec.run, done.spec.scores
    sys.stdout.write(
        f"client {done.client_id}: {out}/model.onnx ({run['arch']}, {run['method']} round "
        f"{run['round']}; accuracy {scores.get('accuracy', float('nan')):.4f}); "
        f"ONNX vs torch max |diff| {done.max_abs_diff:.2e} over "
        f"{done.spec.export['windows_checked']} windows"
        + ("; adapts to its session (sensor.json adaptation)" if done.spec.adaptation else "")
        + "\n"
    )
