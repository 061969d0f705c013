"""The Gaussian mechanisms applied to an upload before it leaves the device.

Both release x + N(0, (z·Δ)² I) for a quantity x of L2 sensitivity Δ, with z the run's
noise multiplier, so that one upload is the Gaussian mechanism of noise multiplier z that
:mod:`mqttfl.privacy.accountant` composes over a client's uploads (Mironov 2017, RDP).

**Class statistics** (prototype methods: FedAPA, FedAPA-S, FedProto, FedSAP). The unit
protected is one window. Every embedding is clipped, h̄_i = h_i · min(1, C/‖h_i‖₂), and
the client releases, over every class c of the run (the class set is public, so which
classes a client holds is not revealed by the set it sums over),

    S_c = Σ_{i: y_i=c} h̄_i  (d values),   n_c = |{i: y_i = c}|,

as one vector v = (S_1, …, S_K, C·n_1, …, C·n_K). Adding or removing one window changes
one S_c by at most ‖h̄_i‖ ≤ C and the same class's C·n_c by exactly C, so
Δ₂(v) = √(C² + C²) = √2·C. Noise N(0, (z√2C)²) on every entry of v is the Gaussian
mechanism of multiplier z: the sums get standard deviation σ_S = √2·z·C and the counts
σ_n = √2·z. Everything after is post-processing, free of privacy cost: a class is
uploaded iff its noisy count ñ_c ≥ max(κ·σ_n, ½) (κ = ``count_threshold``; an absent
class then passes with probability ≤ Φ(-κ), 0.13 % at κ=3), its prototype is
p̃_c = S̃_c / ñ_c, and a method that reads counts gets round(ñ_c) ≥ 1.

Counts are *noised* rather than replaced by a public constant: FedAPA's Eq. 5 (cosine)
would survive any positive constant, but Eqs. 7-9 average and align with prototypes in
embedding units, and S̃_c / n_pub is the class mean scaled by n_c/n_pub, a different
length for every class and client; FedProto's sample-weighted bank (its Eq. 6) needs
relative counts too. ñ_c keeps p̃_c an estimate of the mean at the right scale, at the
price of σ_n = √2·z windows of noise on each count.

The guarantee is for the release given the encoder that embeds the windows. The encoder
is trained on the same windows and is never uploaded by these methods, but a window
changes it too, so strictly the bound holds for an encoder that does not depend on the
window (a frozen or DP-SGD-trained one; VPDR and DPPL make the same assumption). The
attacks of ``benchmarks/bench_privacy.py`` measure what is left in practice.

**Model updates** (FedAvg, WiFed, FedCaring, FedPAM, FedAli): DP-FedAvg (McMahan et al., ICLR
2018, Algorithm 1), with the noise added on the device because the coordinator is not
trusted: the client's update Δ = θ_local - θ_start is clipped to norm S and released as
θ_start + Δ·min(1, S/‖Δ‖₂) + N(0, (zS)² I). The unit protected is the client (all its
data): with and without the client the released update differs by at most S (McMahan
et al.'s adjacency: an absent client contributes nothing), so Δ₂ = S. The sample count
is then a public constant (1), since the number of windows is itself private. FedAli's
update is its weights and its ALP layers' local prototypes, clipped as one vector.
"""

from __future__ import annotations

import math
import secrets
from typing import cast

import numpy as np

#: κ: a class is uploaded when its noisy count is at least κ·σ_n (see the module doc)
DEFAULT_COUNT_THRESHOLD = 3.0


def noise_rng() -> np.random.Generator:
    """A generator seeded from the OS's entropy, never from the run's seed: anyone who
    knows the config knows the seed, and noise they can redraw protects nothing."""
    return np.random.default_rng(secrets.randbits(128))


def clip_rows(x: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled to L2 norm at most ``clip``: x_i · min(1, C/‖x_i‖₂)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-12))
    return cast("np.ndarray", x * scale)


def clip_vector(x: np.ndarray, clip: float) -> np.ndarray:
    """x · min(1, S/‖x‖₂)."""
    norm = float(np.linalg.norm(x))
    return x if norm <= clip else cast("np.ndarray", x * (clip / norm))


def class_sums(
    embeddings: np.ndarray, labels: np.ndarray, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(S, n): per class of ``range(num_classes)`` the sum of the rows and their count."""
    sums = np.zeros((num_classes, embeddings.shape[1]), np.float64)
    np.add.at(sums, labels, embeddings)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    return sums, counts


def private_class_prototypes(
    embeddings: np.ndarray,
    labels: np.ndarray,
    *,
    num_classes: int,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    count_threshold: float = DEFAULT_COUNT_THRESHOLD,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The module's class-statistics mechanism: (classes uploaded, p̃ (k, d) float32,
    round(ñ) (k,) int64 ≥ 1). ``k`` may be 0 when no noisy count passes the threshold."""
    sums, counts = class_sums(clip_rows(embeddings.astype(np.float64), clip), labels, num_classes)
    sigma_n = math.sqrt(2.0) * noise_multiplier
    noisy_sums = sums + rng.normal(0.0, sigma_n * clip, sums.shape)
    noisy_counts = counts + rng.normal(0.0, sigma_n, counts.shape)
    floor = max(count_threshold * sigma_n, 0.5)
    keep = np.flatnonzero(noisy_counts >= floor)
    protos = noisy_sums[keep] / noisy_counts[keep, None]
    released = np.maximum(np.rint(noisy_counts[keep]), 1).astype(np.int64)
    return keep.astype(np.int64), protos.astype(np.float32), released


def private_update(
    weights: np.ndarray,
    start: np.ndarray,
    *,
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """DP-FedAvg on the device: θ_start + clip(θ - θ_start, S) + N(0, (zS)² I), float32."""
    update = clip_vector(weights.astype(np.float64) - start, clip)
    noisy = update + rng.normal(0.0, noise_multiplier * clip, update.shape)
    return (start + noisy).astype(np.float32)


def noise_ratio(released: np.ndarray, start: np.ndarray, *, clip: float, z: float) -> float:
    """‖released - θ_start‖₂ / (z·S·√d): about 1 for a DP-FedAvg release of d weights
    (the noise's norm concentrates at z·S·√d, the clipped update adds at most S), far below
    1 for an update released without its noise. A signal the coordinator can compute from
    the upload and the model it started from; it cannot prove the noise was fresh or
    random (only the device's code can)."""
    d = released.size
    if d == 0 or z <= 0 or clip <= 0:
        return math.inf
    moved = float(np.linalg.norm(released.astype(np.float64) - start))
    return moved / (z * clip * math.sqrt(d))
