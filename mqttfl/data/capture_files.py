"""Numbers out of npz archives and CSV files: what the ``npz`` and ``csv`` capture formats
read, both as CSI (:mod:`mqttfl.data.capture`) and as 1-D feature vectors."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from mqttfl.data.capture_checks import not_format_error, read_capture_bytes
from mqttfl.errors import DataError


def open_npz(path: Path) -> dict[str, np.ndarray]:
    read_capture_bytes(path)  # existence / emptiness
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise DataError(path, "holds a single .npy array, expected an .npz archive")
            return {key: npz[key] for key in npz.files}
    except DataError:
        raise
    except Exception as exc:
        raise not_format_error(path, "npz", f"unreadable archive: {type(exc).__name__}") from None


def scalar_str(arrays: dict[str, np.ndarray], key: str) -> str | None:
    value = arrays.get(key)
    if value is None or value.ndim != 0:
        return None
    return str(value.item())


def read_numeric_csv(path: Path) -> np.ndarray:
    data = read_capture_bytes(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_format_error(path, "csv", "binary data, expected a CSV text file") from None
    rows: list[list[float]] = []
    width: int | None = None
    for lineno, cells in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in cells]
        if not any(cells):
            continue
        try:
            values = [float(c) for c in cells if c != ""]
        except ValueError:
            if not rows and lineno == 1:
                continue  # a header row
            hint = (
                "; looks like an ESP32-CSI-Tool file, use --format esp32"
                if cells[0] == "CSI_DATA"
                else ""
            )
            raise DataError(path, f"line {lineno}: not a row of numbers{hint}") from None
        if width is None:
            width = len(values)
        elif len(values) != width:
            raise DataError(path, f"line {lineno}: {len(values)} columns, earlier rows {width}")
        rows.append(values)
    if not rows or not width:
        raise DataError(path, "no numeric rows found")
    out = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(out).all():
        raise DataError(path, "contains NaN or infinite values")
    return out


def npz_features(path: Path) -> np.ndarray:
    arrays = open_npz(path)
    for key in ("x", "features", "csi_data"):
        if key in arrays:
            out = arrays[key]
            break
    else:
        keys = ", ".join(sorted(arrays)) or "none"
        raise DataError(path, f"no 'x', 'features' or 'csi_data' array (keys: {keys})")
    if out.ndim != 2 or not np.issubdtype(out.dtype, np.number) or np.iscomplexobj(out):
        raise DataError(
            path, f"feature array {key!r} must be real and 2-D, got {out.dtype} {out.shape}"
        )
    return out
