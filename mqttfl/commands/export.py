"""``mqttfl export``: a finished run's client models as ONNX, each with its sensor.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mqttfl.errors import FileError, UsageError


def add_export_command(subparsers: Any) -> None:
    export = subparsers.add_parser(
        "export",
        help="write a client's evaluation model as ONNX with its sensor.json (for mqttfl sense)",
    )
    export.add_argument("run_dir", type=Path, help="a finished run directory")
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
    from mqttfl.export.client import export_client, run_clients, run_summary

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
        done = export_client(
            args.run_dir, client_id, out, shard_dir=args.data, with_shard=args.with_shard
        )
        run, scores = done.spec.run, done.spec.scores
        sys.stdout.write(
            f"client {done.client_id}: {out}/model.onnx ({run['arch']}, {run['method']} round "
            f"{run['round']}; accuracy {scores.get('accuracy', float('nan')):.4f}); "
            f"ONNX vs torch max |diff| {done.max_abs_diff:.2e} over "
            f"{done.spec.export['windows_checked']} windows"
            + ("; adapts to its session (sensor.json adaptation)" if done.spec.adaptation else "")
            + "\n"
        )
    return 0
