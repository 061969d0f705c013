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

Client i's own set P_i is not sent back: it is i's upload padded by Eq. 8 with the class
means, and Q_i already carries those means for the classes i lacks, so i rebuilds it
(:func:`rebuild_own_set`); the downlink carries only P_i's per-class sums, which tell a
client whose remembered upload is not the one aggregated (a restart, a stale upload).
That halves the bounded personal downlink (21.5 KB of 43 at C=21, d=256).

Why a sample at all. Eq. 10's L_c needs P, every client's padded set: N·C·d·4 bytes
per client-round, N² in all (2.15 MB per client at N=100, C=21, d=256). With more than
k+1 uploads in a round (k = ``max_peer_sets``), the broadcast instead carries one sample
S of k+1 padded sets, the same for every client; client i's personal downlink adds the
weights of its L_c, an unbiased estimate of Eq. 10's (1/N)·Σ_j. By
default S is stratified (one set per stratum of
similar sets, ``strata`` of them, weighted by the stratum's share of i's peers; a client
that represents its own stratum also gets one more member of it), sent as int8 with a
scale per set and class, which leaves only the spread within strata to chance (the
deviation from exact Eq. 10 is measured by benchmarks/bench_fedapa_deviation.py; table in
docs/benchmarks/many-clients.md). With ``sampling = "uniform"``, S is k+1 sets drawn uniformly without
replacement from all N (seeded by run and round), as float32, weighted 1/N for P_i,
(N-1)/(N·m) for each of the m members of S other than i, 0 for itself if drawn. One shared
sample rather than one per client because the coordinator then encodes, checkpoints and
publishes S once and one set per client (Q_i), and the broker
fans the broadcast out; each client's estimate is as unbiased as with its own sample.
Sampling keeps peers the server finds dissimilar in play, as Eq. 10 does; the k most
similar (Eq. 5) would bias L_c toward sets L_g already pulls toward. With N ≤ k+1, S is
every set, sent once in the broadcast with no weights, exactly as the paper's Algorithm 1
(the default 6-client job).
"""

from __future__ import annotations

import numpy as np

KMEANS_ITERATIONS = 10


def set_strata(sets: np.ndarray, count: int, *, seed: int, t: int) -> np.ndarray:
    """A stratum label (0..S-1, S ≤ count, none empty) for each of the (N, C, d) sets:
    k-means (k-means++ start, Lloyd steps) on the flattened sets.

    Computed from the sets' Gram matrix G = X·Xᵀ alone (kernel k-means, the same
    iterations): a center is the mean of its members, so with M the (N, S) membership
    matrix scaled by 1/|s|, x_i·c_s = (G·M)_is and |c_s|² = (Mᵀ·G·M)_ss. One (N, N)
    product replaces a pass over the (N, C·d) sets per center and per step, which is
    what keeps it inside a round's turnaround (36 -> ~4 ms at N=100, C=21, d=256). The
    sets are centered first (distances do not change) so that G carries no large
    common offset into the subtractions below.
    """
    n = len(sets)
    x = sets.reshape(n, -1).astype(np.float64)
    x -= x.mean(axis=0)
    gram = x @ x.T
    squared = np.diag(gram).copy()
    rng = np.random.default_rng([seed, t, 11])
    chosen = [int(rng.integers(n))]
    nearest = np.maximum(squared - 2.0 * gram[chosen[0]] + squared[chosen[0]], 0.0)
    for _ in range(1, min(count, n)):
        total = nearest.sum()
        pick = int(rng.choice(n, p=nearest / total)) if total > 0 else int(rng.integers(n))
        chosen.append(pick)
        nearest = np.minimum(nearest, np.maximum(squared - 2.0 * gram[pick] + squared[pick], 0))
    # Start: each center is one set, as a one-member mean.
    members = np.zeros((n, len(chosen)))
    members[chosen, np.arange(len(chosen))] = 1.0
    labels = np.full(n, -1, np.int64)
    for _ in range(KMEANS_ITERATIONS):
        cross = gram @ members  # x_i·c_s
        center_norms = np.einsum("is,is->s", members, cross)  # |c_s|²
        moved = (squared[:, None] - 2.0 * cross + center_norms).argmin(axis=1)
        if np.array_equal(moved, labels):
            break
        labels = moved
        sizes = np.bincount(labels, minlength=members.shape[1]).astype(np.float64)
        kept = sizes > 0  # an emptied center stays where it was
        update = np.zeros_like(members)
        update[np.arange(n), labels] = 1.0
        update[:, kept] /= sizes[kept]
        members[:, kept] = update[:, kept]
    inverse: np.ndarray = np.unique(labels, return_inverse=True)[1]
    return inverse.astype(np.int64)


def shared_sample(n: int, size: int, *, seed: int, t: int) -> np.ndarray:
    """The round's sample S: ``size`` of the n sets, uniformly without replacement, sorted
    (seeded by run and round, so a re-sent downlink is the same)."""
    rng = np.random.default_rng([seed, t, 10])
    return np.sort(rng.choice(n, size=size, replace=False))


def sample_weights(n: int, sample: np.ndarray, row: int) -> np.ndarray:
    """Client ``row``'s L_c weights over [its own set, *S]: 1/n for its own, (n-1)/(n·m)
    for each of the m members of S other than itself, 0 for itself (they sum to 1)."""
    others = sample != row
    weights = np.zeros(len(sample) + 1, np.float32)
    weights[0] = 1.0 / n
    weights[1:][others] = (n - 1) / (n * int(others.sum()))
    return weights


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
    peers = np.bincount(labels, minlength=len(reps))
    own = int(labels[row])
    peers[own] -= 1
    weights = np.zeros(1 + len(reps), np.float32)
    weights[0] = 1.0 / n
    weights[1:] = peers / n
    if reps[own] != row:
        return weights, None
    weights[1 + own] = 0.0  # row represents its own stratum: the alternate stands in
    if peers[own] == 0:
        return weights, None
    return np.append(weights, np.float32(peers[own] / n)), int(alts[own])


def own_set_sums(padded: np.ndarray) -> np.ndarray:
    """(N, C) per-class sums of the padded sets: what a client checks its rebuilt P_i by."""
    sums: np.ndarray = padded.sum(axis=2, dtype=np.float64).astype(np.float32)
    return sums


def rebuild_own_set(
    classes: np.ndarray, prototypes: np.ndarray, anchors: np.ndarray, sums: np.ndarray
) -> np.ndarray | None:
    """P_i from the client's upload (``classes``, ``prototypes``) padded by Eq. 8 with the
    class means, which Q_i (or the global set, ``anchors`` (C, d)) holds for the classes
    i lacks; None unless its per-class sums match the server's ``sums`` (C,)."""
    own = np.array(anchors, np.float32)
    own[np.asarray(classes, np.int64)] = np.asarray(prototypes, np.float32)
    if not np.allclose(own_set_sums(own[None])[0], sums, rtol=1e-4, atol=1e-4):
        return None
    return own


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
