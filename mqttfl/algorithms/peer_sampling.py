"""FedAPA's stratified sample of peer sets: Eq. 10's L_c from k+1 sets, with low variance.

Eq. 10 averages a client's contrastive loss over every client's padded set P_j; sending
all N sets costs N·C·d·4 bytes per client. A uniform sample of k+1 sets is unbiased but
noisy when clients form groups (a sample misses or over-counts whole groups). Here the
server first groups the N sets into k+1 strata of similar sets (k-means on the flattened
sets, seeded by run and round), then draws one representative per stratum; client i
weights a representative by the share of its peers in that stratum, n_s/N (n_s = |s|,
less one for i's own stratum), and its own set by 1/N. Only the spread within strata is
left to chance. When client i is itself its stratum's representative, its personal
downlink carries one more member of that stratum (the stratum's alternate), so the
estimate stays unbiased: for every peer j in stratum s, E[weight of P_j] = 1/N (see
:func:`strata_weights`).
"""

from __future__ import annotations

import numpy as np

KMEANS_ITERATIONS = 10


def set_strata(sets: np.ndarray, count: int, *, seed: int, t: int) -> np.ndarray:
    """A stratum label (0..S-1, S ≤ count, none empty) for each of the (N, C, d) sets:
    k-means (k-means++ start, Lloyd steps) on the flattened sets."""
    n = len(sets)
    x = sets.reshape(n, -1).astype(np.float64)
    rng = np.random.default_rng([seed, t, 11])
    chosen = [int(rng.integers(n))]
    nearest = ((x - x[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(1, min(count, n)):
        total = nearest.sum()
        pick = int(rng.choice(n, p=nearest / total)) if total > 0 else int(rng.integers(n))
        chosen.append(pick)
        nearest = np.minimum(nearest, ((x - x[pick]) ** 2).sum(axis=1))
    centers = x[chosen]
    squared = (x * x).sum(axis=1)
    labels = np.zeros(n, np.int64)
    for _ in range(KMEANS_ITERATIONS):
        distance = squared[:, None] - 2.0 * x @ centers.T + (centers * centers).sum(axis=1)
        labels = distance.argmin(axis=1)
        moved = centers.copy()
        for s in range(len(centers)):
            members = labels == s
            if members.any():
                moved[s] = x[members].mean(axis=0)
        if np.allclose(moved, centers):
            break
        centers = moved
    inverse: np.ndarray = np.unique(labels, return_inverse=True)[1]
    return inverse.astype(np.int64)


def stratified_sample(labels: np.ndarray, *, seed: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Per stratum: a representative, uniformly among its members, and an alternate,
    uniformly among the others (-1 for a stratum of one). Seeded by run and round."""
    rng = np.random.default_rng([seed, t, 12])
    strata = int(labels.max()) + 1
    reps = np.zeros(strata, np.int64)
    alts = np.full(strata, -1, np.int64)
    for s in range(strata):
        members = np.flatnonzero(labels == s)
        reps[s] = rng.choice(members)
        others = members[members != reps[s]]
        if len(others):
            alts[s] = rng.choice(others)
    return reps, alts


def strata_weights(
    labels: np.ndarray, reps: np.ndarray, alts: np.ndarray, row: int
) -> tuple[np.ndarray, int | None]:
    """Client ``row``'s L_c weights over [its own set, *representatives, (alternate)], and
    the alternate's index when it needs one (it represents its own stratum).

    Own set: 1/N. Representative of stratum s: n_s/N, n_s = |s| - [row ∈ s] (its peers in
    s). Unbiased: a peer j ∈ s is drawn with probability 1/|s| when row ∉ s; when row ∈ s
    it is the representative with probability 1/|s| and the alternate (row represented s)
    with probability 1/|s|·1/(|s|-1), and either way weighs (|s|-1)/N: E = 1/N. The
    weights sum to 1.
    """
    n = len(labels)
    sizes = np.bincount(labels, minlength=len(reps))
    weights = np.zeros(1 + len(reps), np.float32)
    weights[0] = 1.0 / n
    extra: int | None = None
    for s, rep in enumerate(reps):
        peers = int(sizes[s]) - int(labels[row] == s)
        if rep != row:
            weights[1 + s] = peers / n
        elif peers > 0:
            extra = int(alts[s])
            weights = np.append(weights, np.float32(peers / n))
    return weights, extra


def quantize_sets(sets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S, C, d) float sets as int8 with one float32 scale per set and class (max |x| /
    127): a quarter of the bytes, so four times the sets fit the same downlink; the
    rounding moves a prototype by at most half a step, far inside the sampling spread."""
    peak = np.abs(sets).max(axis=2)
    scale = (np.where(peak > 0, peak, 1.0) / 127.0).astype(np.float32)
    quantized = np.clip(np.rint(sets / scale[..., None]), -127, 127).astype(np.int8)
    return quantized, scale


def dequantize_sets(quantized: np.ndarray, scale: np.ndarray) -> np.ndarray:
    sets: np.ndarray = quantized.astype(np.float32) * scale[..., None]
    return sets.astype(np.float32)
