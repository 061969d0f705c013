"""Which windows a session's adaptation is estimated from: a minority far from the rest
is left out.

The adapted statistics, the gate's fit and the k-means are means over the windows being
classified, so a few windows unlike any other drag them where they like: 16 windows of
frames any ESP can report (all 127, all 0, noise) among ESPectre C3's 240 held-out windows
took it from 0.98 to 0.75, and on its 120-window session they turned the gate off
(docs/benchmarks/sensing.md, "A sensor a few frames can't steer"). So before the estimate each window
is described, per feature, by its mean over time and the log of its standard deviation
over time (a feature vector: by itself). Each coordinate is centred on the windows'
median and scaled by their median absolute deviation (x 1.4826: a standard deviation of
normal data), never below ``floor``: for a mean, ``floor`` times the feature's standard
deviation over the training windows (``scale``: 1 where the shard was z-scored), for a
log spread ``floor`` itself (0.5: a factor of 1.65). The floor is there because a
session's windows can sit closer together than the classes lie apart, and then a window
of its other class would look far. A window's distance is the root mean square of its
scaled coordinates; the windows farther than ``limit`` are left out of the estimate, the
farthest first and at most ``fraction`` of them. Every window is still classified.

The median and the MAD move little while the hostile windows are a minority, so a
hostile window either lies far (left out) or within ``limit`` of the session's own, where
its pull on a mean over n windows is bounded. No window of ESPectre's real sessions (every
chip, training and held-out) lies past the limit (at most 3.4): on them the estimate is
the exact one. Windows of real CSI from elsewhere (another chip's recording) lie within
it and count like the session's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_LIMIT = 5.0
DEFAULT_FRACTION = 0.4
DEFAULT_FLOOR = 0.5
#: the most windows ``min_adapt_windows`` may ask for (over an hour of ESPectre's windows):
#: past it a setting would only turn adaptation off
MAX_MIN_ADAPT_WINDOWS = 10_000
MAD_TO_STD = 1.4826
SPREAD_EPS = 1e-3  # added to a window's standard deviation before its log (a constant window)
CHUNK = 32  # windows described at once: a float64 copy of 32 windows, not of the buffer
LIMITS = {"limit": (1.0, 1000.0), "floor": (1e-6, 1e6)}


def describe(x: np.ndarray) -> np.ndarray:
    """(n, 2F) per window: each feature's mean over time, then the log of its standard
    deviation over time; (n, F) for feature vectors. Axis -1 is the features, the axes
    between the window and it are time."""
    n = len(x)
    rows = np.reshape(x, (n, -1, np.shape(x)[-1]))
    features = rows.shape[2]
    if rows.shape[1] == 1:
        return rows[:, 0].astype(np.float64)
    out = np.empty((n, 2 * features), np.float64)
    for start in range(0, n, CHUNK):
        part = rows[start : start + CHUNK].astype(np.float64)
        out[start : start + CHUNK, :features] = part.mean(axis=1)
        out[start : start + CHUNK, features:] = np.log(part.std(axis=1) + SPREAD_EPS)
    return out


def feature_scale(x_train: np.ndarray) -> np.ndarray:
    """Each feature's standard deviation over the training windows (and their time), in
    two passes of :data:`CHUNK` windows each: a float64 copy of the whole set would be
    twice the training windows' memory on a small board."""
    rows = np.reshape(x_train, (len(x_train), -1, np.shape(x_train)[-1]))
    count = rows.shape[0] * rows.shape[1]
    total = np.zeros(rows.shape[2], np.float64)
    for start in range(0, len(rows), CHUNK):
        total += rows[start : start + CHUNK].sum(axis=(0, 1), dtype=np.float64)
    mean = total / max(count, 1)
    squares = np.zeros(rows.shape[2], np.float64)
    for start in range(0, len(rows), CHUNK):
        squares += np.square(rows[start : start + CHUNK].astype(np.float64) - mean).sum(axis=(0, 1))
    out: np.ndarray = np.maximum(np.sqrt(squares / max(count, 1)), 1e-12)
    return out


def distances(x: np.ndarray, floor: float, scale: np.ndarray | None = None) -> np.ndarray:
    """Each window's distance from the windows' median (module docstring)."""
    d = describe(x)
    features = np.shape(x)[-1]
    least = np.full(d.shape[1], floor)
    if scale is not None:
        least[:features] *= scale
    centre = np.median(d, axis=0)
    spread = np.maximum(MAD_TO_STD * np.median(np.abs(d - centre), axis=0), least)
    out: np.ndarray = np.sqrt(np.mean(np.square((d - centre) / spread), axis=1))
    return out


@dataclass(frozen=True)
class WindowScreen:
    """Leave the windows farther than ``limit`` out of the estimate, at most ``fraction``
    of them (module docstring); ValueError naming the setting out of its bounds."""

    limit: float = DEFAULT_LIMIT
    fraction: float = DEFAULT_FRACTION
    floor: float = DEFAULT_FLOOR
    scale: np.ndarray | None = None  # (F,) the training windows' per-feature std

    def __post_init__(self) -> None:
        for key, (low, high) in LIMITS.items():
            value = getattr(self, key)
            if not low <= value <= high:  # NaN fails too
                raise ValueError(f"screen.{key} must lie in {low:g}..{high:g}, got {value!r:.40}")
        if not 0.0 <= self.fraction < 0.5:
            raise ValueError(
                f"screen.fraction must lie in 0..0.5 (a minority), got {self.fraction!r:.40}"
            )
        if self.scale is not None and not (
            self.scale.ndim == 1 and np.isfinite(self.scale).all() and (self.scale > 0).all()
        ):
            raise ValueError("screen.scale must list positive, finite numbers")

    def kept(self, x: np.ndarray) -> np.ndarray:
        """(n,) bool: the windows the estimate is made on."""
        keep = np.ones(len(x), bool)
        most = int(self.fraction * len(x))
        if most < 1:
            return keep
        if self.scale is not None and len(self.scale) != np.shape(x)[-1]:
            raise ValueError(
                f"screen.scale holds {len(self.scale)} features, the windows {np.shape(x)[-1]}"
            )
        far = distances(x, self.floor, self.scale)
        farthest = np.argsort(-far, kind="stable")[:most]
        keep[farthest[far[farthest] > self.limit]] = False
        return keep

    def as_dict(self) -> dict[str, object]:
        return {
            "what": "windows farther than limit from the windows' median (per-feature mean "
            "and log spread over time, scaled by the MAD, at least floor, times scale for a "
            "mean) are left out of the estimate, at most fraction of them",
            "limit": self.limit,
            "fraction": self.fraction,
            "floor": self.floor,
            "scale": None if self.scale is None else [float(v) for v in self.scale],
        }

    @classmethod
    def from_dict(cls, data: Any) -> WindowScreen:
        """The screen of :meth:`as_dict`; ValueError naming the field that is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("screen must be an object or null")
        values: list[float] = []
        for key in ("limit", "fraction", "floor"):
            value = data.get(key)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"screen.{key} must be a number, got {value!r:.40}")
            values.append(float(value))
        limit, fraction, floor = values
        scale = data.get("scale")
        if scale is not None and (
            not isinstance(scale, list)
            or not scale
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in scale)
        ):
            raise ValueError("screen.scale must list positive, finite numbers")
        array = None if scale is None else np.asarray(scale, np.float64)
        return cls(limit=limit, fraction=fraction, floor=floor, scale=array)
