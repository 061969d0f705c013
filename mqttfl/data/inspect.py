"""Shard summaries for ``mqttfl data inspect`` and the ``--subcarriers`` syntax.

:func:`inspect_shard` summarises one shard directory, :func:`format_inspection` prints
it; :func:`shard_dirs` finds the shards under a directory; :func:`parse_subcarriers`
reads ``auto``, ``all`` or a list of ranges.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.sessions import sessions_per_label
from mqttfl.data.shard import META_FILE, load_shard
from mqttfl.errors import DataError

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
            raise ValueError(
                f"bad subcarrier list item {part!r}; use e.g. 0-25,27,30-40, 'all' or 'auto'"
            )
    if len(set(out)) != len(out):
        raise ValueError("subcarrier positions repeat")
    return out


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

    sessions: dict[str, Any] | None = None
    if shard.s_train is not None and shard.s_test is not None:
        names = shard.session_names
        sessions = {
            "train": {
                _name(classes, k): v
                for k, v in sessions_per_label(shard.s_train, shard.y_train, names).items()
            },
            "test": {
                _name(classes, k): v
                for k, v in sessions_per_label(shard.s_test, shard.y_test, names).items()
            },
        }
    return {
        "path": str(directory),
        "split": (shard.meta.get("split") or {}).get("method", "time")
        if isinstance(shard.meta.get("split"), dict)
        else "time",
        "sessions_per_label": sessions,
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


def _name(classes: list[str] | None, label: str) -> str:
    index = int(label)
    return classes[index] if classes and 0 <= index < len(classes) else label


def shard_dirs(directory: Path) -> list[Path]:
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


def _short_names(names: list[str], limit: int = 4) -> list[str]:
    shown = [Path(n).name for n in names[:limit]]
    return shown + ([f"+{len(names) - limit} more"] if len(names) > limit else [])


def format_inspection(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        f"{summary['path']}",
        f"  train: {summary['num_train']} samples, test: {summary['num_test']} samples, "
        f"sample shape {tuple(summary['sample_shape'])} ({summary['dtype']})",
        f"  labels train: {summary['label_counts']['train']}",
        f"  labels test:  {summary['label_counts']['test']}",
    ]
    lines.append(f"  split: {summary.get('split', 'time')}")
    for part in ("train", "test"):
        per_label = (summary.get("sessions_per_label") or {}).get(part)
        if per_label:
            lines.append(f"  sessions per label, {part}:")
            lines.extend(
                f"    {label}: {len(names)} ({', '.join(_short_names(names))})"
                for label, names in per_label.items()
            )
    for key in ("kind", "format", "dataset", "device", "window", "stride", "partition"):
        if key in meta:
            lines.append(f"  {key}: {meta[key]}")
    if isinstance(meta.get("subcarriers"), dict):
        sc = meta["subcarriers"]
        lines.append(
            f"  subcarriers: {sc.get('count')} kept ({sc.get('selection')}), "
            f"removed null {_short(sc.get('removed_null'))}, pilot {_short(sc.get('removed_pilot'))}"
        )
    if meta.get("normalization"):
        lines.append(f"  normalization: {meta['normalization'].get('kind', 'yes')}")
    if "source_files" in meta:
        files = meta["source_files"]
        lines.append(
            f"  source files ({len(files)}): {', '.join(files[:3])}{', ...' if len(files) > 3 else ''}"
        )
    return "\n".join(lines)
