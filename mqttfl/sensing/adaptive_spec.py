"""``sensor.json``'s ``adaptation`` section: what a model that adapts to its session needs.

Written by ``mqttfl export`` for a method with ``adapt_norm`` (FedAPA-S), absent for every
other method (and in the files of exports that predate it, which still load). It names
the ONNX graph's statistics input and its embedding and moment outputs
(:mod:`mqttfl.export.adaptive`), the normalization layers with their channels and their
trained statistics (the sensor starts from them; none for a model without BatchNorm,
whose graph has no statistics input and which adapts by the k-means alone), the
personalized prototypes Q_i and which classes they hold, the refinement settings, FedAPA's
temperature τ (the readings' confidence is the softmax of cos/τ, as the training's L_g),
the shift gate (:class:`~mqttfl.adaptation.shift.ShiftGate`, or null: adapt every
session) and the screen (:class:`~mqttfl.adaptation.screen.WindowScreen`, or null: every
window counts). Parsing checks every field, within bounds where a value could stall the
sensor or silently turn adaptation off, and raises ValueError naming it
(``adaptation.<field>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mqttfl.adaptation.refine import MAX_REFINE_STEPS
from mqttfl.adaptation.screen import MAX_MIN_ADAPT_WINDOWS, WindowScreen
from mqttfl.adaptation.shift import ShiftGate

ADAPT_FORMAT = "mqttfl-adapt/1"
INFERENCES = ("prototypes", "head")
TAU_RANGE = (1e-9, 1e9)  # where cos/τ is finite and not flat (FedAPA: 0.5)


@dataclass(frozen=True)
class AdaptationSpec:
    layers: tuple[str, ...]  # the normalization layers, in forward order
    channels: tuple[int, ...]  # channels of each
    trained_mean: tuple[np.ndarray, ...]  # per layer, float64
    trained_var: tuple[np.ndarray, ...]
    inference: str  # "prototypes": k-means from Q_i; "head": the adapted classifier head
    prototypes: np.ndarray | None  # (C, d) Q_i, or None (no Q_i arrived: the head)
    available: np.ndarray | None  # (C,) bool: the classes Q_i holds
    refine_steps: int
    min_adapt_windows: int
    tau: float
    gate: ShiftGate | None
    method: str = ""
    screen: WindowScreen | None = None  # None: every window counts (exports before it)
    statistics_input: str = "norm_stats"
    embedding_output: str = "embedding"
    moments_output: str = "norm_moments"
    counts_output: str = "norm_counts"

    @property
    def uses_prototypes(self) -> bool:
        return (
            self.inference == "prototypes"
            and self.prototypes is not None
            and self.available is not None
            and bool(self.available.any())
        )

    @property
    def normalizes(self) -> bool:
        """Whether the model has normalization statistics to adapt (a graph input)."""
        return bool(self.channels)

    def trained_statistics(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.trained_mean, self.trained_var, strict=True))

    def to_dict(self) -> dict[str, object]:
        return {
            "format": ADAPT_FORMAT,
            "method": self.method,
            "what": (
                "normalization statistics re-estimated on the unlabeled windows being "
                "classified (layer by layer), then cosine k-means from the prototypes Q_i; only "
                "where the gate finds the session shifted"
                if self.normalizes
                else "cosine k-means from the prototypes Q_i on the unlabeled windows being "
                "classified (no normalization layer to re-estimate)"
            ),
            "statistics_input": self.statistics_input,
            "embedding_output": self.embedding_output,
            "moments_output": self.moments_output,
            "counts_output": self.counts_output,
            "layers": [
                {"name": name, "channels": c, "mean": _floats(m), "var": _floats(v)}
                for name, c, m, v in zip(
                    self.layers, self.channels, self.trained_mean, self.trained_var, strict=True
                )
            ],
            "inference": self.inference,
            "prototypes": None
            if self.prototypes is None
            else [_floats(p) for p in self.prototypes],
            "available": None if self.available is None else [bool(a) for a in self.available],
            "refine_steps": self.refine_steps,
            "min_adapt_windows": self.min_adapt_windows,
            "tau": self.tau,
            "gate": None if self.gate is None else self.gate.as_dict(),
            "screen": None if self.screen is None else self.screen.as_dict(),
        }


def _floats(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values).reshape(-1)]


def _vector(value: Any, length: int, what: str) -> np.ndarray:
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a list of numbers") from None
    if array.shape != (length,):
        raise ValueError(f"{what} must hold {length} numbers, got shape {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError(f"{what} holds a value that is not finite")
    return array


def _whole(table: dict[str, Any], key: str, least: int, most: int) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise ValueError(
            f"adaptation.{key} must be a whole number in {least}..{most}, got {value!r:.40}"
        )
    return value


def _name(table: dict[str, Any], key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"adaptation.{key} must be a name")
    return value


def parse_adaptation(data: Any, num_classes: int, features: int) -> AdaptationSpec:
    """The section of :meth:`AdaptationSpec.to_dict` for a model of ``num_classes``
    classes whose samples hold ``features`` per row; ValueError naming the bad field."""
    w = "adaptation."
    if not isinstance(data, dict):
        raise ValueError("adaptation must be an object or absent")
    if data.get("format") != ADAPT_FORMAT:
        raise ValueError(f"{w}format must be {ADAPT_FORMAT!r}, got {data.get('format')!r:.40}")
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise ValueError(f"{w}layers must list the normalization layers (none: an empty list)")
    names: list[str] = []
    channels: list[int] = []
    means: list[np.ndarray] = []
    variances: list[np.ndarray] = []
    for k, layer in enumerate(layers):
        where = f"{w}layers[{k}]"
        if not isinstance(layer, dict):
            raise ValueError(f"{where} must be an object")
        c = layer.get("channels")
        if not isinstance(c, int) or isinstance(c, bool) or c < 1:
            raise ValueError(f"{where}.channels must be a positive whole number")
        name = layer.get("name")
        names.append(name if isinstance(name, str) else str(k))
        channels.append(c)
        means.append(_vector(layer.get("mean"), c, f"{where}.mean"))
        var = _vector(layer.get("var"), c, f"{where}.var")
        if (var < 0).any():
            raise ValueError(f"{where}.var holds a negative variance")
        variances.append(var)
    inference = data.get("inference")
    if inference not in INFERENCES:
        raise ValueError(
            f"{w}inference must be one of {', '.join(INFERENCES)}, got {inference!r:.40}"
        )
    prototypes = available = None
    if data.get("prototypes") is not None:
        try:
            prototypes = np.asarray(data["prototypes"], np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{w}prototypes must be a list of rows of numbers") from None
        if prototypes.ndim != 2 or len(prototypes) != num_classes or not prototypes.shape[1]:
            raise ValueError(f"{w}prototypes must hold one row per class ({num_classes})")
        if not np.isfinite(prototypes).all():
            raise ValueError(f"{w}prototypes holds a value that is not finite")
        mask = data.get("available")
        if (
            not isinstance(mask, list)
            or len(mask) != num_classes
            or not all(isinstance(a, bool) for a in mask)
        ):
            raise ValueError(f"{w}available must list true/false per class ({num_classes})")
        available = np.asarray(mask, bool)
    tau = data.get("tau")
    low, high = TAU_RANGE
    if not isinstance(tau, int | float) or isinstance(tau, bool) or not low <= tau <= high:
        raise ValueError(f"{w}tau must be a number in {low:g}..{high:g}, got {tau!r:.40}")
    gate = screen = None
    if data.get("screen") is not None:
        try:
            screen = WindowScreen.from_dict(data["screen"])
        except ValueError as exc:
            raise ValueError(f"{w}{exc}") from None
        if screen.scale is not None and len(screen.scale) != features:
            raise ValueError(
                f"{w}screen.scale holds {len(screen.scale)} numbers, a sample {features} features"
            )
    if data.get("gate") is not None and not channels:
        raise ValueError(f"{w}gate needs a normalization layer (layers is empty)")
    if data.get("gate") is not None:
        try:
            gate = ShiftGate.from_dict(data["gate"])
        except ValueError as exc:
            raise ValueError(f"{w}{exc}") from None
        if gate.mean.shape != (channels[0],):
            raise ValueError(
                f"{w}gate.mean holds {gate.mean.size} channels, the first layer has {channels[0]}"
            )
    return AdaptationSpec(
        layers=tuple(names),
        channels=tuple(channels),
        trained_mean=tuple(means),
        trained_var=tuple(variances),
        inference=str(inference),
        prototypes=prototypes,
        available=available,
        refine_steps=_whole(data, "refine_steps", 0, MAX_REFINE_STEPS),
        min_adapt_windows=_whole(data, "min_adapt_windows", 2, MAX_MIN_ADAPT_WINDOWS),
        tau=float(tau),
        gate=gate,
        method=str(data.get("method", "")),
        screen=screen,
        statistics_input=_name(data, "statistics_input", "norm_stats"),
        embedding_output=_name(data, "embedding_output", "embedding"),
        moments_output=_name(data, "moments_output", "norm_moments"),
        counts_output=_name(data, "counts_output", "norm_counts"),
    )
