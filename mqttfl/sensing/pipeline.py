"""Packets to model inputs: the preprocessing of ``data prepare``, one packet at a time.

A capture's packets become feature rows with the same function the shards were built
with (:func:`mqttfl.data.preprocess.capture_features`, at the positions ``sensor.json``
lists), so a window cut here equals the shard's window of the same packets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mqttfl.data.capture import Capture
from mqttfl.data.preprocess import capture_features
from mqttfl.errors import DataError
from mqttfl.sensing.spec import Preprocess


def check_layout(pre: Preprocess, subcarriers: int, antenna_pairs: int, where: str) -> None:
    """DataError naming ``where`` when packets do not have the layout the model reads."""
    if pre.positions is None:
        raise DataError(where, "the model reads feature vectors, not CSI packets")
    if pre.raw_subcarriers is not None and subcarriers != pre.raw_subcarriers:
        raise DataError(
            where,
            f"has {subcarriers} subcarriers per packet, but the model was trained on captures "
            f"with {pre.raw_subcarriers} (sensor.json preprocess.subcarriers.raw_count)",
        )
    if subcarriers <= max(pre.positions):
        raise DataError(
            where,
            f"has {subcarriers} subcarriers per packet, but the model reads position "
            f"{max(pre.positions)} (sensor.json preprocess.subcarriers.positions)",
        )
    if antenna_pairs != pre.antenna_pairs:
        raise DataError(
            where,
            f"has {antenna_pairs} antenna pair(s) per packet, but the model was trained on "
            f"{pre.antenna_pairs} (sensor.json preprocess.antenna_pairs)",
        )


def capture_rows(capture: Capture, pre: Preprocess) -> np.ndarray:
    """Feature rows (packets, F) of ``capture`` as the model's training windows had them."""
    pairs = int(np.prod(capture.csi.shape[2:])) if capture.csi.ndim > 2 else 1
    check_layout(pre, capture.num_subcarriers, pairs, str(capture.path))
    assert pre.positions is not None
    rows, _ = capture_features(capture, subcarriers=list(pre.positions), phase=pre.phase)
    if rows.shape[1] != pre.features:
        raise DataError(
            capture.path,
            f"gives {rows.shape[1]} values per packet, the model reads {pre.features} "
            "(sensor.json preprocess.features)",
        )
    return rows


def frame_rows(csi: np.ndarray, pre: Preprocess, subcarrier_index: np.ndarray | None) -> np.ndarray:
    """Rows of complex packets (n, S[, rx, tx]) that arrived one by one (a gateway's)."""
    capture = Capture(
        path=Path("<frames>"), fmt="frames", csi=csi, subcarrier_index=subcarrier_index
    )
    return capture_rows(capture, pre)


@dataclass
class Window:
    """One model input and when its last packet was taken (seconds since the epoch)."""

    x: np.ndarray  # (T, F) or (F,), normalized
    end_time: float
    label: int | None = None  # the true class, for shard windows


class Windower:
    """Windows of ``window`` rows every ``stride`` rows, normalized as at training."""

    def __init__(self, pre: Preprocess) -> None:
        self.pre = pre
        self.rows: list[np.ndarray] = []
        self.skip = 0  # rows still to drop when the stride exceeds the window

    def reset(self) -> None:
        """Start the next window afresh: packets were lost in between (a window is cut from
        consecutive packets, as the training windows were)."""
        self.rows.clear()
        self.skip = 0

    def push(self, row: np.ndarray, time_s: float) -> Window | None:
        if self.skip:
            self.skip -= 1
            return None
        if self.pre.kind == "features":
            return Window(self.pre.normalize(row[None])[0], time_s)
        self.rows.append(row)
        if len(self.rows) < self.pre.window:
            return None
        window = self.pre.normalize(np.stack(self.rows))
        drop = self.pre.stride
        del self.rows[: min(drop, len(self.rows))]
        self.skip = max(0, drop - self.pre.window)
        return Window(window, time_s)
