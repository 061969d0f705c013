"""What a shard's metadata says about turning raw CSI into a model input.

Every source records its preprocessing in ``meta.json`` (:mod:`mqttfl.data.shard_builder`,
:mod:`mqttfl.data.espectre`, :mod:`mqttfl.data.synthetic`); this reads it into the
:class:`~mqttfl.sensing.spec.Preprocess` of ``sensor.json``, and fails naming the key
when a shard does not say enough.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture import ESP_CENTRED_CHIPS
from mqttfl.data.shard import Shard
from mqttfl.errors import DataError
from mqttfl.sensing.replay import recorded_rate
from mqttfl.sensing.spec import Preprocess


def _raw_count(sub: dict[str, Any]) -> int | None:
    """Length of the capture's subcarrier axis: every position is kept, null or pilot
    under a PHY plan; unknown when the user picked positions."""
    selection = str(sub.get("selection", ""))
    positions = list(sub.get("positions") or [])
    if selection.startswith("plan:"):
        return (
            len(positions)
            + len(sub.get("removed_null") or [])
            + len(sub.get("removed_pilot") or [])
        )
    if selection == "all":
        return len(positions)
    return None


def _sample_rate(meta: dict[str, Any]) -> float | None:
    """Packets per second: the meta's own, else measured over its npz recordings."""
    if isinstance(meta.get("sample_rate_hz"), int | float):
        return float(meta["sample_rate_hz"])
    rates = []
    for entry in meta.get("files") or []:
        path = Path(str(entry.get("path", "")))
        if path.suffix == ".npz" and path.is_file():
            rate = recorded_rate(path)
            if rate is not None:
                rates.append(rate)
    return float(np.mean(rates)) if rates else None


def preprocess_from_shard(shard: Shard, *, where: str) -> Preprocess:
    """The :class:`Preprocess` that gives ``shard``'s samples from raw packets."""
    meta = shard.meta
    shape = shard.sample_shape
    norm = meta.get("normalization")
    mean = std = None
    if isinstance(norm, dict):
        mean = np.asarray(norm["mean"], np.float32)
        std = np.asarray(norm["std"], np.float32)
    if len(shape) == 1:
        return Preprocess(
            kind="features",
            window=1,
            stride=1,
            features=shape[0],
            positions=None,
            raw_subcarriers=None,
            subcarrier_index=None,
            capture_format=meta.get("format"),
            mean=mean,
            std=std,
        )
    window, features = shape
    if int(meta.get("window", window)) != window:
        raise DataError(where, f"meta window {meta.get('window')} but samples of {window} packets")
    sub = meta.get("subcarriers")
    if isinstance(sub, dict):
        positions: tuple[int, ...] = tuple(int(p) for p in sub["positions"])
        raw = _raw_count(sub)
        index = sub.get("index")
        index_t = None if index is None else tuple(int(i) for i in index)
    elif isinstance(sub, int):  # the synthetic rooms: every simulated subcarrier, in order
        positions, raw, index_t = tuple(range(sub)), sub, None
    else:
        raise DataError(where, "meta has no 'subcarriers' entry: cannot say which to read")
    chip = str(meta.get("chip") or "")
    return Preprocess(
        kind="csi-windows",
        window=window,
        stride=int(meta.get("stride") or window),
        features=features,
        positions=positions,
        raw_subcarriers=raw,
        subcarrier_index=index_t,
        antenna_pairs=int(meta.get("antenna_pairs", 1)),
        phase=bool(meta.get("phase", False)),
        capture_format=meta.get("format"),
        esp_centred=chip in ESP_CENTRED_CHIPS,
        sample_rate_hz=_sample_rate(meta),
        mean=mean,
        std=std,
    )


def class_names(shard: Shard, num_classes: int) -> tuple[tuple[str, ...], tuple[float | None, ...]]:
    """Class names and the number each stands for (people counts: the class index)."""
    names = shard.meta.get("classes")
    if isinstance(names, list) and len(names) == num_classes:
        labels = tuple(str(n) for n in names)
    else:
        labels = tuple(str(i) for i in range(num_classes))
    counts: list[float | None] = []
    for label in labels:
        try:
            counts.append(float(label))
        except ValueError:
            counts.append(None)
    return labels, tuple(counts)
