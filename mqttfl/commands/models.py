"""``mqttfl models``: the architectures with parameter counts and FLOPs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mqttfl.errors import UsageError


def add_models_command(subparsers: Any) -> None:
    models = subparsers.add_parser("models", help="list models with parameter counts and FLOPs")
    models.add_argument("--num-classes", type=int, default=21)
    models.add_argument("--input", default="64x64", help="input HxW, e.g. 1000x242")
    models.add_argument("--embed-dim", type=int, default=256)
    models.add_argument("--json", action="store_true")
    models.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from mqttfl.models.flops import describe_models

    try:
        height, width = (int(v) for v in args.input.lower().split("x"))
    except ValueError:
        raise UsageError(f"--input must look like HxW, e.g. 1000x242, got {args.input!r}") from None
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
