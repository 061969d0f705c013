"""Per-channel moments from accumulated sums: the one formula both torch and the sensor use.

A normalization layer's input over a set of windows is accumulated, batch by batch, as
each channel's element count M, sum S and sum of squares Q (float64), so the result does
not depend on how the set was batched. Then mean = S / M and the unbiased variance
(S² / M subtracted from Q, over M - 1), which is what BatchNorm keeps as running_var.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class MomentSums:
    """Running per-channel sums of a layer's input (float64)."""

    channels: int
    count: int = 0
    sums: np.ndarray = field(init=False)
    squares: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.sums = np.zeros(self.channels, np.float64)
        self.squares = np.zeros(self.channels, np.float64)

    def add(self, count: int, sums: np.ndarray, squares: np.ndarray) -> None:
        """Add a batch's per-channel element count, sums and sums of squares."""
        self.count += int(count)
        self.sums += np.asarray(sums, np.float64)
        self.squares += np.asarray(squares, np.float64)

    def add_values(self, values: np.ndarray) -> None:
        """Add a batch of a layer's input, shaped (n, channels, *positions)."""
        v = np.asarray(values, np.float64)
        axes = (0, *range(2, v.ndim))
        per_channel = v.size // max(1, v.shape[1])
        self.add(per_channel, v.sum(axis=axes), np.square(v).sum(axis=axes))

    def plus(self, other: MomentSums) -> MomentSums:
        """The sums of both sets."""
        both = MomentSums(self.channels)
        both.add(self.count + other.count, self.sums + other.sums, self.squares + other.squares)
        return both

    def without(self, part: MomentSums) -> MomentSums:
        """The sums of everything here except ``part`` (a subset that was added)."""
        rest = MomentSums(self.channels)
        rest.add(self.count - part.count, self.sums - part.sums, self.squares - part.squares)
        return rest

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, unbiased variance) per channel; a count below 2 gives variance 0."""
        return moments_from_sums(self.count, self.sums, self.squares)


def moments_from_sums(
    count: int, sums: np.ndarray, squares: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """mean = S / M; var = (Q - S² / M) / (M - 1), clipped at 0 (rounding)."""
    m = max(int(count), 1)
    mean = np.asarray(sums, np.float64) / m
    spread = np.asarray(squares, np.float64) - np.asarray(sums, np.float64) * mean
    var = np.maximum(spread, 0.0) / max(m - 1, 1) if count >= 2 else np.zeros_like(mean)
    return mean, var
