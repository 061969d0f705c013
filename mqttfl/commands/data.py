"""The ``mqttfl data prepare`` and ``mqttfl data inspect`` commands.

:func:`add_data_commands` registers them on the ``mqttfl`` argument parser; the
``prepare`` handler calls :func:`~mqttfl.data.shard_builder.prepare_shards` (whose
module docstring is the command's ``--help`` description), the ``inspect`` handler
summarises shard directories with :func:`inspect_shard` and
:func:`format_inspection`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, cast

from mqttfl.data import shard_builder
from mqttfl.data.capture import FORMATS, NEXMON_BANDWIDTHS, NEXMON_CHIPS
from mqttfl.data.inspect import format_inspection, inspect_shard, parse_subcarriers, shard_dirs
from mqttfl.data.labels import parse_classes
from mqttfl.data.recordings import SPLITS
from mqttfl.data.shard_builder import DEFAULT_WINDOW, GROUPINGS, prepare_shards
from mqttfl.errors import UsageError

# ----------------------------------------------------------------------------- CLI


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _subcarrier_arg(text: str) -> str | list[int] | None:
    try:
        return parse_subcarriers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _classes_arg(text: str) -> list[str]:
    try:
        return parse_classes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_prepare(args: argparse.Namespace) -> int:
    try:
        dirs = prepare_shards(
            args.format,
            args.input,
            labels=args.label,
            out=args.out,
            window=args.window,
            stride=args.stride,
            subcarriers=args.subcarriers,
            test_fraction=args.test_fraction,
            seed=args.seed,
            group_by=args.group_by,
            classes=args.classes,
            normalize=args.normalize,
            phase=args.phase,
            drop_pilots=not args.keep_pilots,
            features=args.features,
            nexmon_chip=args.nexmon_chip,
            nexmon_bw=args.nexmon_bw,
            split=args.split,
            session=args.session,
            overwrite=args.force,
        )
    except ValueError as exc:  # a bad option value (label pattern, --features with a binary format)
        raise UsageError(f"data prepare: {exc}") from None
    for d in dirs:
        s = inspect_shard(d)
        sys.stdout.write(
            f"wrote {d}: {s['num_train']} train / {s['num_test']} test samples of shape "
            f"{tuple(s['sample_shape'])}, labels {s['label_counts']['train']}\n"
        )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    dirs = shard_dirs(Path(args.dir))
    summaries = [inspect_shard(d) for d in dirs]
    if args.json:
        payload = summaries[0] if len(summaries) == 1 else summaries
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(format_inspection(s) for s in summaries) + "\n")
    return 0


def add_data_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``data prepare`` and ``data inspect`` on an argparse subparsers object."""
    data = subparsers.add_parser(
        "data", help="turn capture files into client shards, inspect shards"
    )
    sub = data.add_subparsers(dest="data_command", required=True)

    prep = sub.add_parser(
        "prepare",
        help="parse capture files into client shards (train/test windows + meta)",
        description=shard_builder.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument("--format", required=True, choices=FORMATS, help="capture file format")
    prep.add_argument(
        "--input",
        required=True,
        nargs="+",
        metavar="FILE",
        help="capture files (one recording each)",
    )
    prep.add_argument(
        "--label",
        required=True,
        help="a label value, 'filename', 'regex:PATTERN' or 'map:FILE' (JSON/CSV file -> label)",
    )
    prep.add_argument("--out", required=True, type=Path, help="output shard directory")
    prep.add_argument(
        "--window",
        type=_positive_int,
        default=DEFAULT_WINDOW,
        help=f"packets per window (default {DEFAULT_WINDOW}, as in FedAPA)",
    )
    prep.add_argument(
        "--stride",
        type=_positive_int,
        default=None,
        help="packets between window starts (default: the window, no overlap)",
    )
    prep.add_argument(
        "--subcarriers",
        type=_subcarrier_arg,
        default=None,
        help="'auto' (drop null and pilot subcarriers, default), 'all', or positions like 0-25,38-63",
    )
    prep.add_argument(
        "--test-fraction",
        type=_fraction,
        default=0.2,
        help="share of each recording's windows (its end) used for testing (default 0.2)",
    )
    prep.add_argument(
        "--seed", type=int, default=0, help="seed for the order of the training windows"
    )
    grouping = prep.add_mutually_exclusive_group()
    grouping.add_argument(
        "--group-by",
        choices=GROUPINGS,
        default=None,
        help="one client for all inputs (default), per file, per directory or per device",
    )
    grouping.add_argument(
        "--per-file",
        dest="group_by",
        action="store_const",
        const="file",
        help="one client per input file (same as --group-by file)",
    )
    prep.add_argument(
        "--classes",
        type=_classes_arg,
        default=None,
        help="class names fixing the label numbering across clients: comma-separated "
        "names, or integer ranges for counts (0..10, 0-10, 0..3,7)",
    )
    prep.add_argument(
        "--split",
        choices=SPLITS,
        default="window",
        help="'window': the last --test-fraction of every recording is test (default); "
        "'session': whole sessions are test, sessions the client never trains on",
    )
    prep.add_argument(
        "--session",
        default="file",
        metavar="SPEC",
        help="what a recording session is: 'file' (each input file, default) or "
        "'regex:PATTERN' (the group 'session', else group 1, of the pattern in the path, "
        "e.g. 'regex:/(may|august)/')",
    )
    prep.add_argument(
        "--normalize",
        action="store_true",
        help="per-subcarrier z-score fitted on this client's training windows only",
    )
    prep.add_argument(
        "--phase", action="store_true", help="add the sanitised phase next to the amplitude"
    )
    prep.add_argument("--keep-pilots", action="store_true", help="keep the pilot subcarriers")
    prep.add_argument(
        "--features",
        action="store_true",
        help="npz/csv rows are ready 1-D feature vectors (no windows)",
    )
    prep.add_argument(
        "--nexmon-chip", choices=NEXMON_CHIPS, default=None, help="nexmon chip (nexmon only)"
    )
    prep.add_argument(
        "--nexmon-bw",
        type=int,
        choices=NEXMON_BANDWIDTHS,
        default=None,
        help="nexmon bandwidth in MHz (nexmon only)",
    )
    prep.add_argument("--force", action="store_true", help="replace an existing output directory")
    prep.set_defaults(func=cmd_prepare)

    insp = sub.add_parser(
        "inspect", help="summarise a shard directory (or a directory of client-<i>/ shards)"
    )
    insp.add_argument("dir", type=Path, help="shard directory")
    insp.add_argument("--json", action="store_true", help="print the summary as JSON")
    insp.set_defaults(func=cmd_inspect)
    return cast("argparse.ArgumentParser", data)
