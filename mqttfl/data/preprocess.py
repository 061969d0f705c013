"""CSI preprocessing as in FedAPA, Section VI-B.

FedAPA filters out the null subcarriers, then cuts the CSI into non-overlapping
windows of 1,000 packets along time, each window a (packets x subcarriers) matrix.
Here, per capture (:class:`~mqttfl.data.capture.Capture`):

1. amplitude ``|H|`` (optionally the sanitised phase as well, see
   :func:`sanitize_phase`);
2. drop the null subcarriers (guard bands, DC) and the pilot subcarriers, using the
   subcarrier plan of the capture's PHY (tables below); the kept subcarriers are put
   in ascending frequency order;
3. flatten the antenna pairs into the subcarrier axis: (packets, S, rx, tx) becomes
   (packets, rx * tx * S), antenna pair major, subcarrier minor;
4. windows of ``window`` packets every ``stride`` packets (``stride = window``, the
   default, gives FedAPA's non-overlapping windows);
5. optionally a per-subcarrier (per-feature) standardisation whose mean and std are
   fitted on the client's own training windows only (:class:`Normalizer`) and then
   applied to its test windows.

Subcarrier plans (indices relative to DC; IEEE 802.11-2016 / 802.11ac-2013):

==========  ======================  ========================  ===========================
phy         occupied subcarriers    pilots                    removed as null
==========  ======================  ========================  ===========================
legacy20    ±1..±26 (52)            ±7, ±21                   DC and guards beyond ±26
ht20        ±1..±28 (56)            ±7, ±21                   DC and guards beyond ±28
ht40        ±2..±58 (114)           ±11, ±25, ±53             0, ±1, guards beyond ±58
vht80       ±2..±122 (242)          ±11, ±39, ±75, ±103       0, ±1, guards beyond ±122
==========  ======================  ========================  ===========================

What each format reports, and so what is removed (with pilots dropped):

* intel5300: 30 grouped subcarriers (Ng = 2 at 20 MHz: -28, -26, ..., -2, -1, 1, 3,
  ..., 27, 28; Ng = 4 at 40 MHz), no nulls among them; at 20 MHz the group holds the
  pilots +7 and +21, so 28 remain (40 MHz: no pilot in the group, 30 remain).
* atheros: 56 tones (-28..-1, 1..28) at HT20, 114 at HT40; the pilots are dropped
  (52 / 108 remain).
* nexmon: 64/128/256 FFT bins for 20/40/80 MHz, plans ht20/ht40/vht80; 52/108/234
  remain (FedAPA's 242 is vht80 with the pilots kept).
* esp32 (ESP32-CSI-Tool CSV, the 64 L-LTF bins): plan legacy20; the ESP32 marks the
  first 32-bit word (DC and +1) invalid, so +1 is dropped too: 47 remain.
* npz with ESP int8 I/Q (ESPectre, 64 HT-LTF bins): plan ht20, +1 dropped on every
  chip so that all chips give the same 51 subcarriers.
* npz (complex or real) and csv: unknown layout, nothing is removed.

``subcarriers`` (a list of positions along the capture's subcarrier axis, as
:func:`~mqttfl.data.capture.read_capture` returns it) overrides the automatic choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from mqttfl.data.capture import Capture
from mqttfl.errors import DataError


def _sym(values: Sequence[int]) -> frozenset[int]:
    return frozenset(v for x in values for v in (x, -x))


PHY_OCCUPIED: dict[str, frozenset[int]] = {
    "legacy20": _sym(range(1, 27)),
    "ht20": _sym(range(1, 29)),
    "ht40": _sym(range(2, 59)),
    "vht80": _sym(range(2, 123)),
}
PHY_PILOTS: dict[str, frozenset[int]] = {
    "legacy20": _sym((7, 21)),
    "ht20": _sym((7, 21)),
    "ht40": _sym((11, 25, 53)),
    "vht80": _sym((11, 39, 75, 103)),
}


@dataclass(frozen=True)
class SubcarrierSelection:
    """Which positions of a capture's subcarrier axis are kept, and why others are not."""

    positions: tuple[int, ...]  # kept positions, in output order
    index: tuple[int, ...] | None  # their subcarrier indices, None if unknown
    null: tuple[int, ...]  # removed subcarrier indices (null / invalid)
    pilot: tuple[int, ...]  # removed pilot indices
    source: str  # "plan:<phy>", "user" or "all"

    def to_meta(self) -> dict[str, object]:
        return {
            "count": len(self.positions),
            "positions": list(self.positions),
            "index": None if self.index is None else list(self.index),
            "removed_null": list(self.null),
            "removed_pilot": list(self.pilot),
            "selection": self.source,
        }


def select_subcarriers(
    capture: Capture,
    *,
    subcarriers: Sequence[int] | None = None,
    drop_pilots: bool = True,
) -> SubcarrierSelection:
    """Decide which subcarrier positions to keep for ``capture`` (see module doc)."""
    n = capture.num_subcarriers
    index = capture.subcarrier_index
    if subcarriers is not None:
        pos = [int(p) for p in subcarriers]
        bad = [p for p in pos if not 0 <= p < n]
        if bad:
            raise DataError(
                capture.path,
                f"has {n} subcarriers, but subcarrier position {bad[0]} was asked for "
                f"(valid: 0..{n - 1})",
            )
        if len(set(pos)) != len(pos):
            raise DataError(capture.path, "subcarrier positions repeat")
        return SubcarrierSelection(
            positions=tuple(pos),
            index=None if index is None else tuple(int(index[p]) for p in pos),
            null=(),
            pilot=(),
            source="user",
        )
    if index is None or capture.phy not in PHY_OCCUPIED:
        return SubcarrierSelection(tuple(range(n)), None, (), (), "all")
    occupied = PHY_OCCUPIED[capture.phy] - set(capture.invalid_index)
    pilots = PHY_PILOTS[capture.phy] if drop_pilots else frozenset()
    keep = [p for p in range(n) if int(index[p]) in occupied and int(index[p]) not in pilots]
    keep.sort(key=lambda p: int(index[p]))
    null = sorted(int(i) for i in index if int(i) not in occupied)
    pilot = sorted(int(i) for i in index if int(i) in occupied and int(i) in pilots)
    if not keep:
        raise DataError(capture.path, "no subcarriers left after removing null and pilot ones")
    return SubcarrierSelection(
        positions=tuple(keep),
        index=tuple(int(index[p]) for p in keep),
        null=tuple(null),
        pilot=tuple(pilot),
        source=f"plan:{capture.phy}",
    )


def sanitize_phase(csi: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
    """Phase with the linear term removed along subcarriers (axis 1).

    The raw CSI phase carries a random offset and a slope across subcarriers
    (carrier and sampling frequency offsets); the usual linear transformation
    unwraps the phase over frequency and subtracts the line through the first and
    last subcarrier and the mean, leaving the part that reflects the channel.
    ``index`` is the subcarrier index of each position (ascending), default 0..S-1.
    """
    n = csi.shape[1]
    k = np.arange(n, dtype=np.float64) if index is None else np.asarray(index, dtype=np.float64)
    phase = np.unwrap(np.angle(csi).astype(np.float64), axis=1)
    shape = [1] * phase.ndim
    shape[1] = n
    k = k.reshape(shape)
    span = k.take([-1], axis=1) - k.take([0], axis=1)
    span = np.where(span == 0, 1.0, span)
    slope = (phase.take([-1], axis=1) - phase.take([0], axis=1)) / span
    out = phase - slope * k
    out = out - out.mean(axis=1, keepdims=True)
    return cast("np.ndarray", out.astype(np.float32))


def capture_features(
    capture: Capture,
    *,
    subcarriers: Sequence[int] | None = None,
    drop_pilots: bool = True,
    phase: bool = False,
) -> tuple[np.ndarray, SubcarrierSelection]:
    """Per-packet feature rows of a capture: float32 (packets, F).

    F = rx * tx * kept subcarriers (antenna pair major), doubled with ``phase``
    (the amplitude block first, then the sanitised phase block).
    """
    sel = select_subcarriers(capture, subcarriers=subcarriers, drop_pilots=drop_pilots)
    csi = capture.csi[:, list(sel.positions)]
    blocks = [np.abs(csi).astype(np.float32)]
    if phase:
        blocks.append(sanitize_phase(csi, None if sel.index is None else np.array(sel.index)))
    out = []
    for block in blocks:
        # (packets, S, a1, a2, ...) -> (packets, a1, a2, ..., S) -> (packets, pairs * S)
        moved = np.moveaxis(block, 1, -1)
        out.append(moved.reshape(block.shape[0], -1))
    return np.ascontiguousarray(np.concatenate(out, axis=1), dtype=np.float32), sel


def window_starts(num_packets: int, window: int, stride: int | None = None) -> np.ndarray:
    """Start packet of every full window (``stride`` defaults to ``window``)."""
    stride = window if stride is None else stride
    if window < 1 or stride < 1:
        raise ValueError("window and stride must be positive")
    if num_packets < window:
        return np.zeros(0, dtype=np.int64)
    return np.arange(0, num_packets - window + 1, stride, dtype=np.int64)


def make_windows(
    x: np.ndarray,
    window: int,
    stride: int | None = None,
    *,
    path: str | Path = "<memory>",
    min_windows: int = 1,
) -> np.ndarray:
    """Cut (packets, F) rows into windows (n, window, F) along time.

    Raises :class:`DataError` naming ``path`` when fewer than ``min_windows`` windows fit.
    """
    starts = window_starts(len(x), window, stride)
    if len(starts) < min_windows:
        need = window + (min_windows - 1) * (window if stride is None else stride)
        raise DataError(
            path,
            f"too few packets: {len(x)} packets, need at least {need} for "
            f"{min_windows} window(s) of {window} (use a smaller --window)",
        )
    idx = starts[:, None] + np.arange(window)[None, :]
    return np.ascontiguousarray(x[idx], dtype=np.float32)


def split_windows_by_time(
    num_packets: int,
    window: int,
    stride: int | None = None,
    test_fraction: float = 0.2,
) -> tuple[np.ndarray, np.ndarray]:
    """Start packets of train and test windows for one recording, split by time
    (:func:`split_starts_by_time` over every full window's start)."""
    starts = window_starts(num_packets, window, stride)
    train, test = split_starts_by_time(starts, window, test_fraction)
    return starts[train], starts[test]


def split_starts_by_time(
    starts: np.ndarray, span: int, test_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) into one recording's window ``starts`` (ascending), split by
    time.

    The last ``round(test_fraction * n)`` windows (at least one when ``test_fraction``
    is positive and there are two or more windows) are the test windows; train windows
    are the earlier ones that end (``start + span``) before the first test window starts,
    so no packet belongs to both (overlapping strides lose the train windows that would
    straddle). Rows rather than windows: ``span`` 1 and their indices as starts.
    """
    n = len(starts)
    index = np.arange(n, dtype=np.int64)
    if n == 0:
        return index, index
    n_test = round(test_fraction * n)
    if test_fraction > 0 and n >= 2:
        n_test = max(1, n_test)
    n_test = min(n_test, n - 1) if n >= 2 else 0
    if n_test == 0:
        return index, index[:0]
    train = index[: n - n_test]
    train = train[starts[train] + span <= starts[n - n_test]]
    return train, index[n - n_test :]


def gather_windows(x: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    """Windows (len(starts), window, F) of the rows ``x`` starting at ``starts``."""
    if len(starts) == 0:
        return np.zeros((0, window, x.shape[1]), dtype=np.float32)
    idx = starts[:, None] + np.arange(window)[None, :]
    return np.ascontiguousarray(x[idx], dtype=np.float32)


@dataclass(frozen=True)
class Normalizer:
    """Per-feature standardisation ``(x - mean) / std`` over the last axis.

    Fit it on a client's training samples only; apply the same object to its test
    samples, so no test statistic leaks into training.
    """

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray, *, eps: float = 1e-6) -> Normalizer:
        if x.size == 0:
            raise ValueError("cannot fit a normalizer on no samples")
        flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
        mean = flat.mean(axis=0)
        std = flat.std(axis=0)
        std = np.where(std < eps, 1.0, std)
        return cls(mean=mean.astype(np.float32), std=std.astype(np.float32))

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.shape[-1] != self.mean.shape[0]:
            raise ValueError(f"expected {self.mean.shape[0]} features, got {x.shape[-1]}")
        return cast("np.ndarray", ((x - self.mean) / self.std).astype(np.float32))

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Normalizer:
        return cls(
            mean=np.asarray(data["mean"], dtype=np.float32),
            std=np.asarray(data["std"], dtype=np.float32),
        )
