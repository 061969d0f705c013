"""``sensor.json``: everything between raw CSI and a reading, written by ``mqttfl export``.

The sensing side guesses nothing: the file says which positions of a capture's
subcarrier axis the model reads and in what order, whether the sanitised phase follows
the amplitude, how many antenna pairs are flattened into a packet's row, the window and
stride in packets, the per-feature normalization fitted on the client's training
windows, the model's input shape, and what each output class means; for a model that
adapts to its session (FedAPA-S), what adapts (``adaptation``,
:mod:`mqttfl.sensing.adaptive_spec`, absent from a fixed model's file). Loading checks
every field and names the one that is wrong (a :class:`~mqttfl.errors.DataError` on the
file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.errors import DataError
from mqttfl.sensing.adaptive_spec import AdaptationSpec, parse_adaptation

SPEC_FILE = "sensor.json"
MODEL_FILE = "model.onnx"
SPEC_FORMAT = "mqttfl-sensor/1"
MAX_SPEC_BYTES = 16 * 1024 * 1024  # the normalization of 10,000s of features is < 1 MB
#: ``input.kind``: time x feature windows cut from packets, or ready feature vectors
INPUT_KINDS = ("csi-windows", "features")


@dataclass(frozen=True)
class Preprocess:
    """From packets to one model input (see :mod:`mqttfl.data.preprocess`)."""

    kind: str  # one of INPUT_KINDS
    window: int  # packets per window (rows per sample for "features": 1)
    stride: int  # packets between window starts
    features: int  # values per packet row (antenna pairs x subcarriers [x 2 with phase])
    positions: tuple[int, ...] | None  # kept positions of the capture's subcarrier axis
    raw_subcarriers: int | None  # length of that axis in the training captures, if known
    subcarrier_index: tuple[int, ...] | None  # OFDM index of each kept position
    antenna_pairs: int = 1
    phase: bool = False
    capture_format: str | None = None  # the `data prepare` format the shard came from
    esp_centred: bool = False  # ESP frames arrive centred (-32..31): rotate to FFT order
    sample_rate_hz: float | None = None  # packets per second of the training captures
    mean: np.ndarray | None = None  # per-feature normalization, or None
    std: np.ndarray | None = None

    def normalize(self, windows: np.ndarray) -> np.ndarray:
        """``(x - mean) / std`` over the last axis, as the shard's Normalizer applied it."""
        if self.mean is None or self.std is None:
            return np.ascontiguousarray(windows, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # inf: the scores will say
            out: np.ndarray = ((windows - self.mean) / self.std).astype(np.float32)
        return out


@dataclass(frozen=True)
class SensorSpec:
    input_name: str
    input_shape: tuple[int, ...]  # one sample: (T, F) or (F,)
    output_name: str
    classes: tuple[str, ...]
    counts: tuple[float | None, ...]  # the number each class stands for, if any
    preprocess: Preprocess
    run: dict[str, object]
    scores: dict[str, object]
    eval_batch_size: int = 256
    model_file: str = MODEL_FILE
    export: dict[str, object] = field(default_factory=dict)
    #: how the model adapts to the session it classifies (None: a fixed model)
    adaptation: AdaptationSpec | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def to_dict(self) -> dict[str, object]:
        p = self.preprocess
        return {
            "format": SPEC_FORMAT,
            "model_file": self.model_file,
            "input": {"name": self.input_name, "shape": list(self.input_shape), "dtype": "float32"},
            "output": {"name": self.output_name, "classes": len(self.classes), "kind": "scores"},
            "preprocess": {
                "kind": p.kind,
                "window": p.window,
                "stride": p.stride,
                "features": p.features,
                "subcarriers": None
                if p.positions is None
                else {
                    "positions": list(p.positions),
                    "raw_count": p.raw_subcarriers,
                    "index": None if p.subcarrier_index is None else list(p.subcarrier_index),
                },
                "antenna_pairs": p.antenna_pairs,
                "phase": p.phase,
                "capture_format": p.capture_format,
                "esp_centred": p.esp_centred,
                "sample_rate_hz": p.sample_rate_hz,
                "normalization": None
                if p.mean is None or p.std is None
                else {
                    "kind": "per-feature z-score fitted on the client's training windows",
                    "mean": [float(v) for v in p.mean],
                    "std": [float(v) for v in p.std],
                },
            },
            "classes": list(self.classes),
            "counts": list(self.counts),
            "eval_batch_size": self.eval_batch_size,
            "run": self.run,
            "scores": self.scores,
            "export": self.export,
            **({} if self.adaptation is None else {"adaptation": self.adaptation.to_dict()}),
        }

    def write(self, directory: Path) -> Path:
        path = Path(directory) / SPEC_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path


def _need(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"{where}{key} must be {names}, got {value!r:.60}")
    return value


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"{what} must be a list of whole numbers")
    return tuple(value)


def _parse_preprocess(table: dict[str, Any]) -> Preprocess:
    w = "preprocess."
    kind = _need(table, "kind", str, w)
    if kind not in INPUT_KINDS:
        raise ValueError(f"preprocess.kind must be one of {', '.join(INPUT_KINDS)}, got {kind!r}")
    window, stride = _need(table, "window", int, w), _need(table, "stride", int, w)
    features = _need(table, "features", int, w)
    if window < 1 or stride < 1 or features < 1:
        raise ValueError("preprocess.window, stride and features must be positive")
    subcarriers = table.get("subcarriers")
    positions = raw = index = None
    if subcarriers is not None:
        if not isinstance(subcarriers, dict):
            raise ValueError("preprocess.subcarriers must be an object or null")
        positions = _ints(subcarriers.get("positions"), "preprocess.subcarriers.positions")
        raw = subcarriers.get("raw_count")
        if raw is not None and (not isinstance(raw, int) or raw < 1):
            raise ValueError("preprocess.subcarriers.raw_count must be a positive whole number")
        if raw is not None and any(not 0 <= p < raw for p in positions):
            raise ValueError("preprocess.subcarriers.positions must lie in 0..raw_count-1")
        if subcarriers.get("index") is not None:
            index = _ints(subcarriers["index"], "preprocess.subcarriers.index")
    pairs = _need(table, "antenna_pairs", int, w)
    phase = bool(table.get("phase", False))
    if positions is not None and len(positions) * pairs * (2 if phase else 1) != features:
        raise ValueError(
            f"preprocess.features is {features}, but {len(positions)} subcarriers x {pairs} "
            f"antenna pairs{' x 2 (phase)' if phase else ''} give "
            f"{len(positions) * pairs * (2 if phase else 1)}"
        )
    mean = std = None
    norm = table.get("normalization")
    if norm is not None:
        if not isinstance(norm, dict):
            raise ValueError("preprocess.normalization must be an object or null")
        mean = np.asarray(norm.get("mean"), dtype=np.float32)
        std = np.asarray(norm.get("std"), dtype=np.float32)
        if mean.shape != (features,) or std.shape != (features,):
            raise ValueError(
                f"preprocess.normalization has {mean.size} means and {std.size} stds, "
                f"expected {features} each (preprocess.features)"
            )
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
            raise ValueError("preprocess.normalization must be finite with positive stds")
    rate = table.get("sample_rate_hz")
    if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
        raise ValueError("preprocess.sample_rate_hz must be a positive number or null")
    fmt = table.get("capture_format")
    return Preprocess(
        kind=kind,
        window=window,
        stride=stride,
        features=features,
        positions=positions,
        raw_subcarriers=raw,
        subcarrier_index=index,
        antenna_pairs=pairs,
        phase=phase,
        capture_format=fmt if isinstance(fmt, str) else None,
        esp_centred=bool(table.get("esp_centred", False)),
        sample_rate_hz=None if rate is None else float(rate),
        mean=mean,
        std=std,
    )


def _scalars(value: Any, what: str) -> dict[str, object]:
    """``run`` and ``scores``: what the sensor shows of them (strings, numbers, null);
    nested values are left out, a non-finite number too."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object")
    kept: dict[str, object] = {}
    for key, item in value.items():
        if isinstance(item, float) and not np.isfinite(item):
            continue
        if item is None or isinstance(item, str | int | float):
            kept[str(key)] = item
    return kept


def parse_spec(data: Any) -> SensorSpec:
    """A :class:`SensorSpec` from the parsed JSON; ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    if data.get("format") != SPEC_FORMAT:
        raise ValueError(f"format must be {SPEC_FORMAT!r}, got {data.get('format')!r:.40}")
    inp = _need(data, "input", dict, "")
    out = _need(data, "output", dict, "")
    shape = _ints(inp.get("shape"), "input.shape")
    if not shape or any(n < 1 for n in shape):
        raise ValueError("input.shape must list the positive sizes of one sample")
    preprocess = _parse_preprocess(_need(data, "preprocess", dict, ""))
    expected = (
        (preprocess.window, preprocess.features)
        if preprocess.kind == "csi-windows"
        else (preprocess.features,)
    )
    if shape != expected:
        raise ValueError(
            f"input.shape is {list(shape)}, but preprocess gives samples of {list(expected)} "
            "(window x features)"
        )
    classes = data.get("classes")
    if (
        not isinstance(classes, list)
        or len(classes) < 2
        or not all(isinstance(c, str) for c in classes)
    ):
        raise ValueError("classes must list at least two class names")
    counts = data.get("counts", [None] * len(classes))
    if not isinstance(counts, list) or len(counts) != len(classes):
        raise ValueError(f"counts must list one number (or null) per class ({len(classes)})")
    if out.get("classes") != len(classes):
        raise ValueError(f"output.classes is {out.get('classes')!r}, classes lists {len(classes)}")
    batch = data.get("eval_batch_size", 256)
    if not isinstance(batch, int) or batch < 1:
        raise ValueError("eval_batch_size must be a positive whole number")
    return SensorSpec(
        input_name=_need(inp, "name", str, "input."),
        input_shape=shape,
        output_name=_need(out, "name", str, "output."),
        classes=tuple(classes),
        counts=tuple(None if c is None else float(c) for c in counts),
        preprocess=preprocess,
        run=_scalars(data.get("run"), "run"),
        scores=_scalars(data.get("scores"), "scores"),
        eval_batch_size=batch,
        model_file=_need(data, "model_file", str, ""),
        export=_scalars(data.get("export"), "export"),
        adaptation=None
        if data.get("adaptation") is None
        else parse_adaptation(data["adaptation"], len(classes), shape[-1]),
    )


def load_spec(directory: Path) -> SensorSpec:
    """Read ``directory/sensor.json``; DataError naming the file and the field."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(directory, "not a directory (expected what `mqttfl export` wrote)")
    path = directory / SPEC_FILE
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise DataError(path, f"{size} bytes, more than a sensor.json holds ({MAX_SPEC_BYTES})")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(path, "file not found (run `mqttfl export` first)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, f"unreadable JSON: {exc}") from None
    except RecursionError:
        raise DataError(path, "unreadable JSON: nested too deeply") from None
    try:
        return parse_spec(data)
    except (ValueError, TypeError) as exc:
        raise DataError(path, str(exc)) from None
    except RecursionError:  # a value nested too deeply to show in the message
        raise DataError(path, "a value is nested too deeply") from None
