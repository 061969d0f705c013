"""Raw capture files -> per-client shards (``mqttfl data prepare``), and ``data inspect``.

Every input file is one recording.  Each recording is split by time: its last
``test_fraction`` of windows are test windows, the earlier ones train windows, and
no packet is in both (see :func:`~mqttfl.data.preprocess.split_starts_by_time`), so
no window leaks from train into test.  Recordings are grouped into clients:

* ``all`` (default): every input is one client's data; the shard is written to OUT;
* ``file`` (``per_file_clients=True`` / ``--per-file``): one client per input file;
* ``dir``: one client per parent directory (a device or a session folder);
* ``device``: one client per device the parser reports (ESP chip or MAC, nexmon chip);

With more than one client, client ``i`` (in order of first input) goes to
``OUT/client-<i>/``, the layout the ``shards`` data source reads.

With ``--split session`` whole recording sessions are test instead
(:mod:`mqttfl.data.sessions`): a session is an input file (``--session file``, the
default) or what a regex finds in its path (``--session 'regex:/(may|august)/'``), and
no session is in both splits.  Either way every window carries its session id
(``s_train``/``s_test`` in the shard, named in ``meta.json``'s ``sessions``).

Labels (``--label``), one per recording, and how names become integers: see
:mod:`mqttfl.data.labels`.

Everything is read, checked and computed before anything is written, and the output
is moved into place only when complete, so a bad input leaves no output behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture import FORMATS, Capture, load_capture, read_features
from mqttfl.data.capture_checks import check_paths
from mqttfl.data.labels import LabelSpec, labels_ordinal, resolve_labels
from mqttfl.data.preprocess import (
    Normalizer,
    SubcarrierSelection,
    capture_features,
    gather_windows,
    window_starts,
)
from mqttfl.data.recordings import (
    Recording,
    Split,
    SplitRecordings,
    check_split,
    split_recordings,
)
from mqttfl.data.sessions import session_function, split_meta
from mqttfl.data.shard import Shard, replace_directory, save_shard
from mqttfl.errors import DataError
from mqttfl.paths import creation_problem

DEFAULT_WINDOW = 1000  # FedAPA Sec. VI-B


# ----------------------------------------------------------------------------- recordings


@dataclass
class _ReadFile:
    """One input file, read: its per-packet features (or feature rows) and what one
    client's files must agree on."""

    path: Path
    label_name: str
    y: int
    rows: np.ndarray  # (packets, F) per-packet features, or (n, F) feature vectors
    device: str
    shape_key: tuple[Any, ...]  # what must agree inside one client
    shape_text: str
    selection: SubcarrierSelection | None
    capture_info: dict[str, object]


#: --group-by -> what the recordings of one client share
_GROUP_KEYS: dict[str, Callable[[_ReadFile], Any]] = {
    "all": lambda rec: 0,
    "file": lambda rec: rec.path.resolve(),
    "dir": lambda rec: rec.path.resolve().parent,
    "device": lambda rec: rec.device,
}
GROUPINGS: tuple[str, ...] = tuple(_GROUP_KEYS)


def _read_recording(
    path: Path,
    fmt: str,
    label_name: str,
    y: int,
    *,
    features: bool,
    subcarriers: str | Sequence[int] | None,
    drop_pilots: bool,
    phase: bool,
    nexmon_chip: str | None,
    nexmon_bw: int | None,
) -> _ReadFile:
    if features:
        rows = read_features(path, fmt)
        return _ReadFile(
            path,
            label_name,
            y,
            rows,
            fmt,
            ("features", rows.shape[1]),
            f"{rows.shape[1]} features",
            None,
            {},
        )
    cap: Capture = load_capture(path, fmt, nexmon_chip=nexmon_chip, nexmon_bw=nexmon_bw)
    if isinstance(subcarriers, str):
        if subcarriers != "all":
            raise ValueError(f"subcarriers must be 'all', None or positions, not {subcarriers!r}")
        chosen: Sequence[int] | None = list(range(cap.num_subcarriers))
    else:
        chosen = subcarriers
    rows, sel = capture_features(cap, subcarriers=chosen, drop_pilots=drop_pilots, phase=phase)
    shape = tuple(int(d) for d in cap.csi.shape[1:])
    text = f"{shape[0]} subcarriers" + (
        f" x {' x '.join(map(str, shape[1:]))} antennas" if len(shape) > 1 else ""
    )
    if cap.phy:
        text += f" ({cap.phy})"
    return _ReadFile(
        path,
        label_name,
        y,
        rows,
        cap.device,
        ("csi", shape, cap.phy, sel.positions),
        text,
        sel,
        {"phy": cap.phy, "bandwidth": cap.bandwidth, **cap.info},
    )


def _check_client(recordings: list[_ReadFile]) -> None:
    first = recordings[0]
    for rec in recordings[1:]:
        if rec.shape_key != first.shape_key:
            raise DataError(
                rec.path,
                f"has {rec.shape_text}, but {first.path} in the same client has "
                f"{first.shape_text}; one client's recordings must match",
            )


def _windowed(
    read: _ReadFile, session: str, *, features: bool, window: int, stride: int | None
) -> Recording:
    n = len(read.rows)
    if features:
        starts = np.arange(n, dtype=np.int64)
        return Recording(str(read.path), session, read.y, read.rows, starts, 1)
    if n < window:
        raise DataError(
            read.path,
            f"too few packets: {n} packets, fewer than one window of {window} (use a smaller --window)",
        )
    starts = window_starts(n, window, stride)
    windows = gather_windows(read.rows, starts, window)
    return Recording(str(read.path), session, read.y, windows, starts, window)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def _counts(y: np.ndarray) -> dict[str, int]:
    labels, counts = np.unique(y, return_counts=True)
    return {str(int(lab)): int(c) for lab, c in zip(labels, counts, strict=True)}


def _build_shard(
    reads: list[_ReadFile],
    *,
    fmt: str,
    features: bool,
    window: int,
    stride: int | None,
    test_fraction: float,
    seed: int,
    normalize: bool,
    phase: bool,
    classes: list[str] | None,
    client_index: int,
    num_clients: int,
    group_by: str,
    split: Split = "window",
    session_of: Callable[[Path], str] | None = None,
) -> Shard:
    _check_client(reads)
    session_of = session_of or session_function("file")
    sessions = [session_of(read.path) for read in reads]
    check_split(split, test_fraction)
    recordings = [
        _windowed(read, session, features=features, window=window, stride=stride)
        for read, session in zip(reads, sessions, strict=True)
    ]
    names = ", ".join(str(r.path) for r in reads)
    unit = "rows" if features else "windows"
    parts = split_recordings(
        recordings,
        split,
        test_fraction,
        where=names,
        hint="use --session regex:PATTERN or more input files",
    )
    if len(parts.x_train) == 0:
        raise DataError(names, f"no training {unit} (too few packets for a window of {window})")
    if test_fraction > 0 and len(parts.x_test) == 0:
        raise DataError(
            names,
            f"too few {unit} for a train/test split: every recording gives a single "
            f"{'row' if features else 'window'} (use a smaller --window or --test-fraction 0)",
        )
    x_train, x_test = parts.x_train, parts.x_test
    norm: Normalizer | None = None
    if normalize:
        norm = Normalizer.fit(x_train)
        x_train, x_test = norm.apply(x_train), norm.apply(x_test)
    order = np.random.default_rng(seed).permutation(len(x_train))
    x_train, y_train, s_train = x_train[order], parts.y_train[order], parts.s_train[order]
    meta: dict[str, object] = {
        "kind": "features" if features else "csi-windows",
        "format": fmt,
        "source_files": [str(r.path) for r in reads],
        "device": ", ".join(sorted({r.device for r in reads})),
        "client_index": client_index,
        "num_clients": num_clients,
        "group_by": group_by,
        "classes": classes,
        "ordinal": labels_ordinal(classes),
        "label_counts": {"train": _counts(y_train), "test": _counts(parts.y_test)},
        "sessions": parts.session_names,
        "split": _split_meta(reads, parts, split, test_fraction, unit),
        "normalization": None
        if norm is None
        else {"kind": "per-feature z-score fitted on train", **norm.to_dict()},
        "seed": seed,
        "files": _files_meta(reads, parts, features),
        **_shape_meta(reads[0], int(x_train.shape[-1]), features, window, stride, phase),
    }
    return Shard(
        x_train=np.ascontiguousarray(x_train, dtype=np.float32),
        y_train=y_train,
        x_test=np.ascontiguousarray(x_test, dtype=np.float32),
        y_test=parts.y_test,
        meta=_jsonable(meta),
        s_train=s_train,
        s_test=parts.s_test,
    )


def _split_meta(
    reads: list[_ReadFile], parts: SplitRecordings, split: Split, fraction: float, unit: str
) -> dict[str, object]:
    if split == "window":
        return {
            "method": "time",
            "test_fraction": fraction,
            "detail": f"the last {unit} of each recording are test; none shares a packet with train",
        }
    return split_meta(
        np.array(parts.recording_sessions),
        np.array([r.y for r in reads]),
        parts.held,
        parts.session_names,
        fraction,
    )


def _files_meta(
    reads: list[_ReadFile], parts: SplitRecordings, features: bool
) -> list[dict[str, Any]]:
    files = []
    for read, session, (train, test) in zip(
        reads, parts.recording_sessions, parts.counts, strict=True
    ):
        files.append(
            {
                "path": str(read.path),
                "label": read.label_name,
                "y": read.y,
                "session": parts.session_names[session],
                "rows" if features else "packets": len(read.rows),
                "train": train,
                "test": test,
                "device": read.device,
                **({"capture": _jsonable(read.capture_info)} if read.capture_info else {}),
            }
        )
    return files


def _shape_meta(
    first: _ReadFile, width: int, features: bool, window: int, stride: int | None, phase: bool
) -> dict[str, object]:
    if features:
        return {"features": width}
    sel = first.selection
    assert sel is not None
    return {
        "window": window,
        "stride": window if stride is None else stride,
        "phase": phase,
        "subcarriers": sel.to_meta(),
        "antenna_pairs": int(np.prod(first.shape_key[1][1:])) if len(first.shape_key[1]) > 1 else 1,
        "features_per_packet": width,
    }


def _group(recordings: list[_ReadFile], group_by: str) -> list[list[_ReadFile]]:
    groups: dict[Any, list[_ReadFile]] = {}
    key = _GROUP_KEYS[group_by]
    for rec in recordings:
        groups.setdefault(key(rec), []).append(rec)
    return list(groups.values())


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(out, "exists and is not a directory")
    problem = creation_problem(out)
    if problem is not None:
        raise DataError(out, f"cannot create the directory: {problem}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError(out, "already exists and is not empty (pass --force to replace it)")


def _write(shards: list[Shard], out: Path, overwrite: bool) -> list[Path]:
    _check_out(out, overwrite)
    if len(shards) == 1:
        save_shard(shards[0], out)  # atomic, replaces an existing directory
        return [out]

    def write(tmp: Path) -> None:
        for i, shard in enumerate(shards):
            save_shard(shard, tmp / f"client-{i}")

    replace_directory(out, write)
    return [out / f"client-{i}" for i in range(len(shards))]


def _distinct(paths: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise DataError(path, "given twice as input")
        seen.add(path.resolve())
    return paths


def build_shards(
    fmt: str,
    inputs: Sequence[str | Path],
    *,
    labels: LabelSpec,
    window: int = DEFAULT_WINDOW,
    stride: int | None = None,
    subcarriers: str | Sequence[int] | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    per_file_clients: bool = False,
    group_by: str | None = None,
    classes: Sequence[str] | None = None,
    normalize: bool = False,
    phase: bool = False,
    drop_pilots: bool = True,
    features: bool = False,
    nexmon_chip: str | None = None,
    nexmon_bw: int | None = None,
    split: Split = "window",
    session: str = "file",
) -> list[Shard]:
    """Everything :func:`prepare_shards` does except writing: one Shard per client."""
    split = check_split(split)
    session_of = session_function(session)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if features and fmt not in ("npz", "csv"):
        raise ValueError("feature-vector shards come from npz or csv files")
    if not inputs:
        raise ValueError("no input files")
    if window < 1 or (stride is not None and stride < 1):
        raise ValueError("window and stride must be positive")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError("test_fraction must be in [0, 1)")
    group = group_by or ("file" if per_file_clients else "all")
    if group not in GROUPINGS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPINGS)}")
    paths = _distinct(check_paths(inputs))
    names, ys, class_list = resolve_labels(labels, paths, classes=classes)
    recordings = [
        _read_recording(
            p,
            fmt,
            name,
            y,
            features=features,
            subcarriers=subcarriers,
            drop_pilots=drop_pilots,
            phase=phase,
            nexmon_chip=nexmon_chip,
            nexmon_bw=nexmon_bw,
        )
        for p, name, y in zip(paths, names, ys, strict=True)
    ]
    groups = _group(recordings, group)
    return [
        _build_shard(
            recs,
            fmt=fmt,
            features=features,
            window=window,
            stride=stride,
            test_fraction=test_fraction,
            seed=seed,
            normalize=normalize,
            phase=phase,
            classes=class_list,
            client_index=i,
            num_clients=len(groups),
            group_by=group,
            split=split,
            session_of=session_of,
        )
        for i, recs in enumerate(groups)
    ]


def prepare_shards(
    fmt: str,
    inputs: Sequence[str | Path],
    *,
    out: str | Path,
    overwrite: bool = False,
    **options: Any,
) -> list[Path]:
    """Parse, preprocess, split and write client shards; return their directories.

    ``options`` are :func:`build_shards`'s.  ``fmt``: one of
    :data:`~mqttfl.data.capture.FORMATS`.  ``labels``: see :mod:`mqttfl.data.labels`.  ``window``/``stride``: packets per window and between window starts
    (``stride`` defaults to ``window``: non-overlapping).  ``subcarriers``: None for
    the automatic null/pilot removal, ``"all"``, or positions to keep.
    ``features=True`` reads npz/csv rows as ready 1-D feature vectors instead of CSI.
    One client -> the shard is OUT itself; several -> ``OUT/client-<i>/``.
    Raises :class:`DataError` naming the offending file; then nothing is written.
    """
    out = Path(out)
    _check_out(out, overwrite)  # fail fast, before parsing anything
    shards = build_shards(fmt, inputs, **options)
    return _write(shards, out, overwrite)
