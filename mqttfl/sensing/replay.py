"""Recorded inputs: a capture file replayed at its packet rate, or a shard's test split."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from mqttfl.data.capture import FORMATS, Capture, load_capture
from mqttfl.data.shard import ARRAYS_FILE, META_FILE, Shard, read_json_file
from mqttfl.errors import DataError
from mqttfl.sensing.spec import SensorSpec


def recorded_rate(path: Path) -> float | None:
    """Packets per second of an npz recording that says how long it lasted
    (ESPectre's ``duration_ms``), else None."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "duration_ms" not in npz.files or "csi_data" not in npz.files:
                return None
            duration = float(npz["duration_ms"]) / 1000.0
            packets = int(npz["csi_data"].shape[0])
    except (OSError, ValueError, KeyError):
        return None
    return packets / duration if duration > 0 and packets > 1 else None


def guess_format(path: Path, spec: SensorSpec) -> str:
    """The capture format: the one the model's shards were prepared from when the file
    could be one, else by extension."""
    trained = spec.preprocess.capture_format
    suffix = path.suffix.lower()
    by_suffix = {".npz": "npz", ".dat": "intel5300", ".pcap": "nexmon"}.get(suffix)
    if suffix == ".csv":
        by_suffix = "esp32" if trained == "esp32" else "csv"
    if trained in FORMATS and (by_suffix is None or by_suffix == trained):
        return str(trained)
    if by_suffix is None:
        raise DataError(
            path, f"cannot tell the capture format; pass --format ({', '.join(FORMATS)})"
        )
    return by_suffix


def read_capture_file(
    path: Path, fmt: str, *, nexmon_chip: str | None = None, nexmon_bw: int | None = None
) -> Capture:
    return load_capture(path, fmt, nexmon_chip=nexmon_chip, nexmon_bw=nexmon_bw)


def replay_rate(path: Path, spec: SensorSpec, override: float | None) -> float:
    """Packets per second to replay at: --rate, the file's own, or the training data's."""
    if override is not None:
        return override
    rate = recorded_rate(path) if path.suffix.lower() == ".npz" else None
    rate = rate or spec.preprocess.sample_rate_hz
    if rate is None:
        raise DataError(
            path, "does not say its packet rate and sensor.json has none: pass --rate HZ or --fast"
        )
    return rate


def read_test_split(path: Path) -> Shard:
    """A shard's test split alone (a device has no use for the training windows, which
    can be most of its memory); checked as :func:`~mqttfl.data.shard.load_shard` checks."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(path, "shard directory not found")
    meta = read_json_file(path / META_FILE)
    arrays = path / ARRAYS_FILE
    if not arrays.is_file():
        raise DataError(arrays, "file not found")
    try:
        with np.load(arrays, allow_pickle=False) as npz:
            missing = [k for k in ("x_test", "y_test") if k not in npz.files]
            if missing:
                raise DataError(arrays, f"missing arrays: {', '.join(missing)}")
            x, y = npz["x_test"], npz["y_test"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise DataError(arrays, f"corrupt npz: {exc}") from None
    if not isinstance(meta, dict):
        raise DataError(path / META_FILE, "expected a JSON object")
    empty_x = np.zeros((0, *x.shape[1:]), np.float32)
    try:
        return Shard(empty_x, np.zeros(0, np.int64), x, y, meta)
    except DataError as exc:
        raise DataError(arrays, str(exc).removeprefix("<memory>: ")) from None


def read_shard(path: Path, spec: SensorSpec) -> Shard:
    """A shard's test split, whose samples the model reads as they are; DataError naming
    what differs from sensor.json."""
    shard = read_test_split(path)
    if shard.sample_shape != spec.input_shape:
        raise DataError(
            path,
            f"holds samples of shape {list(shard.sample_shape)}, the model reads "
            f"{list(spec.input_shape)} (sensor.json input.shape)",
        )
    pre = spec.preprocess
    norm = shard.meta.get("normalization")
    if (norm is None) != (pre.mean is None):
        raise DataError(
            path,
            "was prepared "
            + ("without" if norm is None else "with")
            + " per-feature normalization, sensor.json "
            + ("has" if pre.mean is not None else "has none")
            + " (preprocess.normalization): not this model's data",
        )
    if isinstance(norm, dict) and pre.mean is not None and pre.std is not None:
        mean = np.asarray(norm.get("mean"), np.float32)
        std = np.asarray(norm.get("std"), np.float32)
        if mean.shape != pre.mean.shape or not (
            np.array_equal(mean, pre.mean) and np.array_equal(std, pre.std)
        ):
            raise DataError(
                path,
                "was normalized with other statistics than sensor.json's "
                "(preprocess.normalization): not the exported client's shard",
            )
    sub = shard.meta.get("subcarriers")
    if isinstance(sub, dict) and pre.positions is not None:
        positions = tuple(int(p) for p in sub.get("positions") or [])
        if positions != pre.positions:
            raise DataError(
                path,
                "reads other subcarrier positions than sensor.json "
                "(preprocess.subcarriers.positions)",
            )
    if len(shard.y_test) and int(shard.y_test.max()) >= spec.num_classes:
        raise DataError(
            path, f"has label {int(shard.y_test.max())}, the model knows {spec.num_classes} classes"
        )
    return shard
