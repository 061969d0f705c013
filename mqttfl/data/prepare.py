"""Raw capture files -> per-client shards (``mqttfl data prepare``), and ``data inspect``.

Every input file is one recording.  Each recording is split by time: its last
``test_fraction`` of windows are test windows, the earlier ones train windows, and
no packet is in both (see :func:`~mqttfl.data.preprocess.split_windows_by_time`), so
no window leaks from train into test.  Recordings are grouped into clients:

* ``all`` (default): every input is one client's data; the shard is written to OUT;
* ``file`` (``per_file_clients=True`` / ``--per-file``): one client per input file;
* ``dir``: one client per parent directory (a device or a session folder);
* ``device``: one client per device the parser reports (ESP chip or MAC, nexmon chip);

With more than one client, client ``i`` (in order of first input) goes to
``OUT/client-<i>/``, the layout the ``shards`` data source reads.

Labels (``--label``), one per recording:

* a plain value (``walk``, ``3``): every input gets it;
* ``filename``: the activity word in the file name (tokens split on ``_-.``), from
  :data:`ACTIVITIES` (the intel5300-activity recordings) or ``--classes``;
* ``regex:PATTERN``: searched in the input path; the named group ``label``, else
  group 1, else the whole match;
* ``map:FILE`` (or any existing ``.json``/``.csv`` file): a JSON object or CSV rows
  ``file,label``; keys are paths relative to the mapping file, or bare file names.

Label names become integers in a way that is the same for every client: integers
stay as they are; names are indexed in ``--classes`` when given, else in
:data:`ACTIVITIES` when they all belong to it, else in their sorted order (recorded
in the meta; pass ``--classes`` when clients are prepared separately).

Everything is read, checked and computed before anything is written, and the output
is moved into place only when complete, so a bad input leaves no output behind.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture import FORMATS, NEXMON_BANDWIDTHS, NEXMON_CHIPS, Capture, check_paths, load_capture, read_features
from mqttfl.data.preprocess import (
    Normalizer,
    SubcarrierSelection,
    capture_features,
    gather_windows,
    split_windows_by_time,
)
from mqttfl.data.shard import META_FILE, Shard, load_shard, save_shard
from mqttfl.errors import DataError, MqttflError

# The activity vocabulary of the intel5300-activity recordings; the index is the label.
ACTIVITIES: tuple[str, ...] = ("brushteeth", "cook", "getintobed", "sleeping", "walk", "washingdishes")
GROUPINGS: tuple[str, ...] = ("all", "file", "dir", "device")
DEFAULT_WINDOW = 1000  # FedAPA Sec. VI-B

LabelSpec = str | int | Mapping[str, str | int]


# ----------------------------------------------------------------------------- labels


def _load_mapping(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(path, f"unreadable label mapping: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DataError(path, "label mapping is not a text file") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"label mapping is not valid JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(data, dict) or not all(isinstance(v, (str, int)) for v in data.values()):
            raise DataError(path, 'label mapping must be a JSON object {"file": "label", ...}')
        return {str(k): str(v) for k, v in data.items()}
    mapping: dict[str, str] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        row = [c.strip() for c in row]
        if not any(row):
            continue
        if len(row) != 2:
            raise DataError(path, f"line {lineno}: expected 'file,label', got {len(row)} columns")
        if lineno == 1 and row[1].lower() == "label":
            continue  # header
        mapping[row[0]] = row[1]
    if not mapping:
        raise DataError(path, "label mapping is empty")
    return mapping


class _MappingLookup:
    def __init__(self, mapping: Mapping[str, str | int], base: Path | None, source: str) -> None:
        self.source = source
        self.by_path: dict[Path, str] = {}
        self.by_name: dict[str, str] = {}
        for key, value in mapping.items():
            key_path = Path(key)
            full = key_path if key_path.is_absolute() or base is None else base / key_path
            self.by_path[full.resolve()] = str(value)
            if len(key_path.parts) == 1:
                self.by_name[key] = str(value)

    def __call__(self, path: Path) -> str:
        for candidate in (self.by_path.get(path.resolve()), self.by_name.get(path.name),
                          self.by_name.get(path.stem)):
            if candidate is not None:
                return candidate
        raise DataError(path, f"has no label in {self.source}")


def _filename_label(vocabulary: Sequence[str]) -> Callable[[Path], str]:
    words = {w.lower(): w for w in vocabulary}

    def infer(path: Path) -> str:
        tokens = [t for t in re.split(r"[^A-Za-z0-9]+", path.stem.lower()) if t]
        found = sorted({words[t] for t in tokens if t in words})
        if len(found) != 1:
            what = "no known activity" if not found else f"several activities ({', '.join(found)})"
            raise DataError(
                path, f"file name names {what}; known: {', '.join(vocabulary)} "
                "(use --classes, a mapping file or regex:PATTERN)",
            )
        return found[0]

    return infer


def _regex_label(pattern: str) -> Callable[[Path], str]:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad label pattern {pattern!r}: {exc}") from None

    def infer(path: Path) -> str:
        match = regex.search(path.as_posix())
        if match is None:
            raise DataError(path, f"label pattern {pattern!r} does not match the file name")
        if "label" in regex.groupindex:
            value = match.group("label")
        elif regex.groups:
            value = match.group(1)
        else:
            value = match.group(0)
        if not value:
            raise DataError(path, f"label pattern {pattern!r} matched an empty label")
        return value

    return infer


def _label_function(spec: LabelSpec, classes: Sequence[str] | None) -> Callable[[Path], str]:
    if isinstance(spec, Mapping):
        return _MappingLookup(spec, None, "the label mapping")
    if isinstance(spec, bool):
        raise ValueError("label must be a value, 'filename', 'regex:...' or 'map:FILE'")
    if isinstance(spec, int):
        return lambda _path: str(spec)
    spec = str(spec)
    if spec in ("filename", "name"):
        return _filename_label(tuple(classes) if classes else ACTIVITIES)
    if spec.startswith("regex:"):
        return _regex_label(spec[len("regex:"):])
    mapping_path: Path | None = None
    if spec.startswith("map:"):
        mapping_path = Path(spec[len("map:"):])
        if not mapping_path.is_file():
            raise DataError(mapping_path, "label mapping file not found")
    elif Path(spec).suffix.lower() in (".json", ".csv") and Path(spec).is_file():
        mapping_path = Path(spec)
    if mapping_path is not None:
        mapping = _load_mapping(mapping_path)
        return _MappingLookup(mapping, mapping_path.parent, str(mapping_path))
    if not spec.strip():
        raise ValueError("empty label")
    return lambda _path: spec


def resolve_labels(
    spec: LabelSpec, paths: Sequence[Path], *, classes: Sequence[str] | None = None
) -> tuple[list[str], list[int], list[str] | None]:
    """Label name and integer label for each path, plus the class names (or None).

    See the module docstring for the accepted ``spec`` forms and the name -> integer rule.
    """
    func = _label_function(spec, classes)
    names = [func(p) for p in paths]
    if classes:
        class_list = [str(c) for c in classes]
        if len(set(class_list)) != len(class_list):
            raise ValueError("classes repeat")
        index = {c: i for i, c in enumerate(class_list)}
        ys = []
        for path, name in zip(paths, names, strict=True):
            if name not in index:
                raise DataError(path, f"label {name!r} is not one of the classes {', '.join(class_list)}")
            ys.append(index[name])
        return names, ys, class_list
    if all(re.fullmatch(r"\d+", n) for n in names):
        return names, [int(n) for n in names], None
    if all(n in ACTIVITIES for n in names):
        return names, [ACTIVITIES.index(n) for n in names], list(ACTIVITIES)
    class_list = sorted(set(names))
    return names, [class_list.index(n) for n in names], class_list


# ----------------------------------------------------------------------------- parsing


def parse_subcarriers(text: str) -> str | list[int] | None:
    """``auto`` -> None, ``all`` -> "all", ``0-25,27,30-40`` -> positions (inclusive ranges)."""
    text = text.strip().lower()
    if text in ("", "auto"):
        return None
    if text == "all":
        return "all"
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*(?:-|\.\.|:)\s*(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f"empty subcarrier range {part!r}")
            out.extend(range(lo, hi + 1))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise ValueError(f"bad subcarrier list item {part!r}; use e.g. 0-25,27,30-40, 'all' or 'auto'")
    if len(set(out)) != len(out):
        raise ValueError("subcarrier positions repeat")
    return out


@dataclass
class _Recording:
    path: Path
    label_name: str
    y: int
    rows: np.ndarray  # (packets, F) per-packet features, or (n, F) feature vectors
    device: str
    shape_key: tuple[Any, ...]  # what must agree inside one client
    shape_text: str
    selection: SubcarrierSelection | None
    capture_info: dict[str, Any]


def _read_recording(
    path: Path, fmt: str, label_name: str, y: int, *, features: bool,
    subcarriers: str | Sequence[int] | None, drop_pilots: bool, phase: bool,
    nexmon_chip: str | None, nexmon_bw: int | None,
) -> _Recording:
    if features:
        rows = read_features(path, fmt)
        return _Recording(path, label_name, y, rows, fmt, ("features", rows.shape[1]),
                          f"{rows.shape[1]} features", None, {})
    cap: Capture = load_capture(path, fmt, nexmon_chip=nexmon_chip, nexmon_bw=nexmon_bw)
    chosen = list(range(cap.num_subcarriers)) if subcarriers == "all" else subcarriers
    rows, sel = capture_features(cap, subcarriers=chosen, drop_pilots=drop_pilots, phase=phase)
    shape = tuple(int(d) for d in cap.csi.shape[1:])
    text = f"{shape[0]} subcarriers" + (f" x {' x '.join(map(str, shape[1:]))} antennas" if len(shape) > 1 else "")
    if cap.phy:
        text += f" ({cap.phy})"
    return _Recording(path, label_name, y, rows, cap.device, ("csi", shape, cap.phy, sel.positions),
                      text, sel, {"phy": cap.phy, "bandwidth": cap.bandwidth, **cap.info})


def _check_client(recordings: list[_Recording]) -> None:
    first = recordings[0]
    for rec in recordings[1:]:
        if rec.shape_key != first.shape_key:
            raise DataError(
                rec.path,
                f"has {rec.shape_text}, but {first.path} in the same client has "
                f"{first.shape_text}; one client's recordings must match",
            )


def _split_recording(
    rec: _Recording, *, features: bool, window: int, stride: int | None, test_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    n = len(rec.rows)
    if features:
        n_test = int(round(test_fraction * n))
        if test_fraction > 0 and n >= 2:
            n_test = max(1, n_test)
        n_test = min(n_test, n - 1) if n >= 2 else 0
        return rec.rows[: n - n_test], rec.rows[n - n_test :]
    if n < window:
        raise DataError(
            rec.path,
            f"too few packets: {n} packets, fewer than one window of {window} (use a smaller --window)",
        )
    train_starts, test_starts = split_windows_by_time(n, window, stride, test_fraction)
    return gather_windows(rec.rows, train_starts, window), gather_windows(rec.rows, test_starts, window)


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
    recordings: list[_Recording], *, fmt: str, features: bool, window: int, stride: int | None,
    test_fraction: float, seed: int, normalize: bool, phase: bool, classes: list[str] | None,
    client_index: int, num_clients: int, group_by: str,
) -> Shard:
    _check_client(recordings)
    parts_train, parts_test, ys_train, ys_test, files = [], [], [], [], []
    for rec in recordings:
        tr, te = _split_recording(rec, features=features, window=window, stride=stride,
                                  test_fraction=test_fraction)
        parts_train.append(tr)
        parts_test.append(te)
        ys_train.append(np.full(len(tr), rec.y, dtype=np.int64))
        ys_test.append(np.full(len(te), rec.y, dtype=np.int64))
        files.append({"path": str(rec.path), "label": rec.label_name, "y": rec.y,
                      "rows" if features else "packets": int(len(rec.rows)),
                      "train": int(len(tr)), "test": int(len(te)), "device": rec.device,
                      **({"capture": _jsonable(rec.capture_info)} if rec.capture_info else {})})
    x_train = np.concatenate(parts_train)
    x_test = np.concatenate(parts_test)
    y_train = np.concatenate(ys_train)
    y_test = np.concatenate(ys_test)
    names = ", ".join(str(r.path) for r in recordings)
    unit = "rows" if features else "windows"
    if len(x_train) == 0:
        raise DataError(names, f"no training {unit} (too few packets for a window of {window})")
    if test_fraction > 0 and len(x_test) == 0:
        raise DataError(
            names, f"too few {unit} for a train/test split: every recording gives a single "
            f"{'row' if features else 'window'} (use a smaller --window or --test-fraction 0)",
        )
    norm: Normalizer | None = None
    if normalize:
        norm = Normalizer.fit(x_train)
        x_train, x_test = norm.apply(x_train), norm.apply(x_test)
    order = np.random.default_rng(seed).permutation(len(x_train))
    x_train, y_train = x_train[order], y_train[order]
    first = recordings[0]
    meta: dict[str, Any] = {
        "kind": "features" if features else "csi-windows",
        "format": fmt,
        "source_files": [str(r.path) for r in recordings],
        "device": ", ".join(sorted({r.device for r in recordings})),
        "client_index": client_index,
        "num_clients": num_clients,
        "group_by": group_by,
        "classes": classes,
        "label_counts": {"train": _counts(y_train), "test": _counts(y_test)},
        "split": {"method": "time", "test_fraction": test_fraction,
                  "detail": f"the last {unit} of each recording are test; none shares a packet with train"},
        "normalization": None if norm is None else {"kind": "per-feature z-score fitted on train", **norm.to_dict()},
        "seed": seed,
        "files": files,
    }
    if features:
        meta["features"] = int(x_train.shape[-1])
    else:
        sel = first.selection
        assert sel is not None
        meta.update({
            "window": window,
            "stride": window if stride is None else stride,
            "phase": phase,
            "subcarriers": sel.to_meta(),
            "antenna_pairs": int(np.prod(first.shape_key[1][1:])) if len(first.shape_key[1]) > 1 else 1,
            "features_per_packet": int(x_train.shape[-1]),
        })
    return Shard(x_train=np.ascontiguousarray(x_train, dtype=np.float32), y_train=y_train,
                 x_test=np.ascontiguousarray(x_test, dtype=np.float32), y_test=y_test,
                 meta=_jsonable(meta))


def _group(recordings: list[_Recording], group_by: str) -> list[list[_Recording]]:
    groups: dict[Any, list[_Recording]] = {}
    for rec in recordings:
        if group_by == "all":
            key: Any = 0
        elif group_by == "file":
            key = rec.path.resolve()
        elif group_by == "dir":
            key = rec.path.resolve().parent
        else:
            key = rec.device
        groups.setdefault(key, []).append(rec)
    return list(groups.values())


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(out, "exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError(out, "already exists and is not empty (pass --force to replace it)")


def _write(shards: list[Shard], out: Path, overwrite: bool) -> list[Path]:
    _check_out(out, overwrite)
    if len(shards) == 1:
        save_shard(shards[0], out)  # atomic, replaces an existing directory
        return [out]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    old: Path | None = None
    try:
        for i, shard in enumerate(shards):
            save_shard(shard, tmp / f"client-{i}")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rmdir(old)
            os.rename(out, old)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return [out / f"client-{i}" for i in range(len(shards))]


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
) -> list[Shard]:
    """Everything :func:`prepare_shards` does except writing: one Shard per client."""
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
    paths = check_paths(inputs)
    seen: dict[Path, Path] = {}
    for p in paths:
        if p.resolve() in seen:
            raise DataError(p, "given twice as input")
        seen[p.resolve()] = p
    names, ys, class_list = resolve_labels(labels, paths, classes=classes)
    recordings = [
        _read_recording(p, fmt, name, y, features=features, subcarriers=subcarriers,
                        drop_pilots=drop_pilots, phase=phase, nexmon_chip=nexmon_chip,
                        nexmon_bw=nexmon_bw)
        for p, name, y in zip(paths, names, ys, strict=True)
    ]
    groups = _group(recordings, group)
    return [
        _build_shard(recs, fmt=fmt, features=features, window=window, stride=stride,
                     test_fraction=test_fraction, seed=seed, normalize=normalize, phase=phase,
                     classes=class_list, client_index=i, num_clients=len(groups), group_by=group)
        for i, recs in enumerate(groups)
    ]


def prepare_shards(
    fmt: str,
    inputs: Sequence[str | Path],
    *,
    labels: LabelSpec,
    out: str | Path,
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
    overwrite: bool = False,
) -> list[Path]:
    """Parse, preprocess, split and write client shards; return their directories.

    ``fmt``: one of :data:`~mqttfl.data.capture.FORMATS`.  ``labels``: see the module
    docstring.  ``window``/``stride``: packets per window and between window starts
    (``stride`` defaults to ``window``: non-overlapping).  ``subcarriers``: None for
    the automatic null/pilot removal, ``"all"``, or positions to keep.
    ``features=True`` reads npz/csv rows as ready 1-D feature vectors instead of CSI.
    One client -> the shard is OUT itself; several -> ``OUT/client-<i>/``.
    Raises :class:`DataError` naming the offending file; then nothing is written.
    """
    out = Path(out)
    _check_out(out, overwrite)  # fail fast, before parsing anything
    shards = build_shards(
        fmt, inputs, labels=labels, window=window, stride=stride, subcarriers=subcarriers,
        test_fraction=test_fraction, seed=seed, per_file_clients=per_file_clients,
        group_by=group_by, classes=classes, normalize=normalize, phase=phase,
        drop_pilots=drop_pilots, features=features, nexmon_chip=nexmon_chip, nexmon_bw=nexmon_bw,
    )
    return _write(shards, out, overwrite)


# ----------------------------------------------------------------------------- inspect


def inspect_shard(directory: str | Path) -> dict[str, Any]:
    """Summary of one shard directory: counts, shapes, label counts and its meta."""
    directory = Path(directory)
    shard = load_shard(directory)
    classes = shard.meta.get("classes") if isinstance(shard.meta.get("classes"), list) else None

    def named(y: np.ndarray) -> dict[str, int]:
        labels, counts = np.unique(y, return_counts=True)
        out = {}
        for lab, c in zip(labels, counts, strict=True):
            key = classes[int(lab)] if classes and 0 <= int(lab) < len(classes) else str(int(lab))
            out[key] = int(c)
        return out

    return {
        "path": str(directory),
        "num_train": shard.num_train,
        "num_test": shard.num_test,
        "sample_shape": list(shard.sample_shape),
        "x_train_shape": list(shard.x_train.shape),
        "x_test_shape": list(shard.x_test.shape),
        "dtype": str(shard.x_train.dtype),
        "classes": classes,
        "label_counts": {"train": named(shard.y_train), "test": named(shard.y_test)},
        "meta": shard.meta,
    }


def _shard_dirs(directory: Path) -> list[Path]:
    if (directory / META_FILE).is_file():
        return [directory]
    if directory.is_dir():
        subdirs = sorted(
            (d for d in directory.iterdir() if d.is_dir() and (d / META_FILE).is_file()),
            key=lambda d: (len(d.name), d.name),
        )
        if subdirs:
            return subdirs
        raise DataError(directory, "not a shard directory (no meta.json, no client-<i>/ shards)")
    raise DataError(directory, "shard directory not found")


def _short(value: Any, limit: int = 8) -> Any:
    if isinstance(value, list) and len(value) > limit:
        return f"[{len(value)} values: {', '.join(map(str, value[:4]))}, ...]"
    if isinstance(value, dict):
        return {k: _short(v, limit) for k, v in value.items()}
    return value


def format_inspection(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        f"{summary['path']}",
        f"  train: {summary['num_train']} samples, test: {summary['num_test']} samples, "
        f"sample shape {tuple(summary['sample_shape'])} ({summary['dtype']})",
        f"  labels train: {summary['label_counts']['train']}",
        f"  labels test:  {summary['label_counts']['test']}",
    ]
    for key in ("kind", "format", "dataset", "device", "window", "stride", "partition"):
        if key in meta:
            lines.append(f"  {key}: {meta[key]}")
    if isinstance(meta.get("subcarriers"), dict):
        sc = meta["subcarriers"]
        lines.append(f"  subcarriers: {sc.get('count')} kept ({sc.get('selection')}), "
                     f"removed null {_short(sc.get('removed_null'))}, pilot {_short(sc.get('removed_pilot'))}")
    if meta.get("normalization"):
        lines.append(f"  normalization: {meta['normalization'].get('kind', 'yes')}")
    if "source_files" in meta:
        files = meta["source_files"]
        lines.append(f"  source files ({len(files)}): {', '.join(files[:3])}{', ...' if len(files) > 3 else ''}")
    return "\n".join(lines)


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
    items = [c.strip() for c in text.split(",") if c.strip()]
    if not items or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError("expected distinct comma-separated class names")
    return items


def cmd_prepare(args: argparse.Namespace) -> int:
    try:
        dirs = prepare_shards(
            args.format, args.input, labels=args.label, out=args.out, window=args.window,
            stride=args.stride, subcarriers=args.subcarriers, test_fraction=args.test_fraction,
            seed=args.seed, group_by=args.group_by, classes=args.classes, normalize=args.normalize,
            phase=args.phase, drop_pilots=not args.keep_pilots, features=args.features,
            nexmon_chip=args.nexmon_chip, nexmon_bw=args.nexmon_bw, overwrite=args.force,
        )
    except ValueError as exc:  # a bad option value (label pattern, --features with a binary format)
        raise MqttflError(f"data prepare: {exc}") from None
    for d in dirs:
        s = inspect_shard(d)
        sys.stdout.write(
            f"wrote {d}: {s['num_train']} train / {s['num_test']} test samples of shape "
            f"{tuple(s['sample_shape'])}, labels {s['label_counts']['train']}\n"
        )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    dirs = _shard_dirs(Path(args.dir))
    summaries = [inspect_shard(d) for d in dirs]
    if args.json:
        payload = summaries[0] if len(summaries) == 1 else summaries
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(format_inspection(s) for s in summaries) + "\n")
    return 0


def add_data_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``data prepare`` and ``data inspect`` on an argparse subparsers object."""
    data = subparsers.add_parser("data", help="turn capture files into client shards, inspect shards")
    sub = data.add_subparsers(dest="data_command", required=True)

    prep = sub.add_parser(
        "prepare", help="parse capture files into client shards (train/test windows + meta)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument("--format", required=True, choices=FORMATS, help="capture file format")
    prep.add_argument("--input", required=True, nargs="+", metavar="FILE", help="capture files (one recording each)")
    prep.add_argument("--label", required=True,
                      help="a label value, 'filename', 'regex:PATTERN' or 'map:FILE' (JSON/CSV file -> label)")
    prep.add_argument("--out", required=True, type=Path, help="output shard directory")
    prep.add_argument("--window", type=_positive_int, default=DEFAULT_WINDOW,
                      help=f"packets per window (default {DEFAULT_WINDOW}, as in FedAPA)")
    prep.add_argument("--stride", type=_positive_int, default=None,
                      help="packets between window starts (default: the window, no overlap)")
    prep.add_argument("--subcarriers", type=_subcarrier_arg, default=None,
                      help="'auto' (drop null and pilot subcarriers, default), 'all', or positions like 0-25,38-63")
    prep.add_argument("--test-fraction", type=_fraction, default=0.2,
                      help="share of each recording's windows (its end) used for testing (default 0.2)")
    prep.add_argument("--seed", type=int, default=0, help="seed for the order of the training windows")
    grouping = prep.add_mutually_exclusive_group()
    grouping.add_argument("--group-by", choices=GROUPINGS, default=None,
                          help="one client for all inputs (default), per file, per directory or per device")
    grouping.add_argument("--per-file", dest="group_by", action="store_const", const="file",
                          help="one client per input file (same as --group-by file)")
    prep.add_argument("--classes", type=_classes_arg, default=None,
                      help="comma-separated class names fixing the label numbering across clients")
    prep.add_argument("--normalize", action="store_true",
                      help="per-subcarrier z-score fitted on this client's training windows only")
    prep.add_argument("--phase", action="store_true", help="add the sanitised phase next to the amplitude")
    prep.add_argument("--keep-pilots", action="store_true", help="keep the pilot subcarriers")
    prep.add_argument("--features", action="store_true",
                      help="npz/csv rows are ready 1-D feature vectors (no windows)")
    prep.add_argument("--nexmon-chip", choices=NEXMON_CHIPS, default=None, help="nexmon chip (nexmon only)")
    prep.add_argument("--nexmon-bw", type=int, choices=NEXMON_BANDWIDTHS, default=None,
                      help="nexmon bandwidth in MHz (nexmon only)")
    prep.add_argument("--force", action="store_true", help="replace an existing output directory")
    prep.set_defaults(func=cmd_prepare)

    insp = sub.add_parser("inspect", help="summarise a shard directory (or a directory of client-<i>/ shards)")
    insp.add_argument("dir", type=Path, help="shard directory")
    insp.add_argument("--json", action="store_true", help="print the summary as JSON")
    insp.set_defaults(func=cmd_inspect)
    return data
