"""FedAPA's equations, as arrays: λ_t's warm-up (Eq. 11), the similarity weights and
personalized prototypes (Eqs. 5-7), their padding (Eq. 8) and the two prototype losses
(Eqs. 9-10)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np

from mqttfl.training.lazy import F, torch

if TYPE_CHECKING:
    from torch import Tensor

#: the paper's default T_warm (stated under Eq. 11)
PAPER_WARMUP_ROUNDS = 50


def warmup_length(rounds: int, warmup_rounds: int | None) -> int:
    """T_warm of Eq. 11: ``warmup_rounds`` if set, else min(50, max(1, ⌊T/2⌋))."""
    if warmup_rounds is not None:
        return warmup_rounds
    return min(PAPER_WARMUP_ROUNDS, max(1, rounds // 2))


def warmup_lambda(t: int, *, lambda_min: float, lambda_max: float, warmup_rounds: int) -> float:
    """Eq. 11: λ_t = λ_min + (λ_max-λ_min)/2 · (1 - cos(π u_t)), u_t = min(t, T_warm)/T_warm."""
    u = min(t, warmup_rounds) / warmup_rounds
    return lambda_min + (lambda_max - lambda_min) / 2.0 * (1.0 - math.cos(math.pi * u))


def _softmax_masked(logits: np.ndarray, mask: np.ndarray, axis: int) -> np.ndarray:
    shifted = np.where(mask, logits, -np.inf)
    peak = np.max(shifted, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.where(mask, np.exp(shifted - peak), 0.0)
    total = weights.sum(axis=axis, keepdims=True)
    return cast(
        "np.ndarray", np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    )


def similarity_weights(prototypes: np.ndarray, mask: np.ndarray, tau: float) -> np.ndarray:
    """Eqs. 5-6: α[c, i, j] = softmax_j over J_c(i) of cos(p_i^c, p_j^c)/τ.

    ``prototypes`` is (N, C, d), ``mask`` (N, C) marks the classes each client has.
    J_c(i) holds the clients j (i itself included) that share class c with i.
    """
    norms = np.linalg.norm(prototypes, axis=2, keepdims=True)
    unit = prototypes / np.maximum(norms, 1e-12)
    per_class = np.ascontiguousarray(unit.transpose(1, 0, 2))  # (C, N, d)
    similarity = per_class @ per_class.transpose(0, 2, 1)  # (C, N, N), Eq. 5
    eligible = mask.T[:, :, None] & mask.T[:, None, :]
    return _softmax_masked(similarity / tau, eligible, axis=2)  # Eq. 6


def personalized_prototypes(
    prototypes: np.ndarray, mask: np.ndarray, tau: float, weights: np.ndarray | None = None
) -> np.ndarray:
    """Eqs. 5-7 for every client and class: q_i^c = Σ_j α_ij^c p_j^c, as (N, C, d).

    The same α as :func:`similarity_weights`, without materializing it: with u the unit
    prototypes, e_ij = exp((u_i·u_j - u_i·u_i)/τ) shifts each row by its own similarity,
    which is the row's maximum (Cauchy-Schwarz), so this is the usual stable softmax; the
    peers j outside J_c(i) are masked by zeroing their rows of the right-hand side, and the
    normalizer Σ_j e_ij is one more column of the same product. Two batched matmuls of
    (C, N, N) and no elementwise pass over α; rows of clients lacking c are left to Eq. 8.
    ``weights`` (N,), buffered mode's staleness weights s(τ_j): α_ij ∝ s(τ_j)·e_ij (scaling
    peer j's rows scales its numerator and normalizer terms alike).
    """
    per_class = np.ascontiguousarray(prototypes.transpose(1, 0, 2), dtype=np.float32)  # (C, N, d)
    held = np.ascontiguousarray(mask.T, dtype=np.float32)[:, :, None]  # (C, N, 1)
    if weights is not None:
        held = held * np.asarray(weights, np.float32)[None, :, None]
    norms = np.linalg.norm(per_class, axis=2, keepdims=True)
    scaled = per_class / np.maximum(norms, 1e-12)
    scaled *= np.float32(1.0 / math.sqrt(tau))
    logits = scaled @ scaled.transpose(0, 2, 1)  # (C, N, N): cos(p_i, p_j)/τ, Eq. 5
    logits -= np.einsum("cnd,cnd->cn", scaled, scaled)[:, :, None]
    np.exp(logits, out=logits)
    out = logits @ np.concatenate([per_class * held, held], axis=2)  # (C, N, d+1)
    q = out[..., :-1] / np.maximum(out[..., -1:], np.finfo(np.float32).tiny)  # Eqs. 6-7
    return cast("np.ndarray", q.transpose(1, 0, 2))


def aggregate_prototypes(
    prototypes: np.ndarray,
    mask: np.ndarray,
    *,
    tau: float,
    similarity: bool = True,
    weights: np.ndarray | None = None,
    personalized: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1, lines 5-11, vectorized over clients and classes.

    Returns (Q (N, C, d), padded P (N, C, d), available (C,)). For a class c that client
    i lacks, Eq. 8 sets p_i^c = q_i^c = the mean of p_j^c over the clients j that have c
    (the equation's uniform 1/|J_c| mean). A class nobody has stays zero and unavailable.
    With ``weights`` (N,) (buffered mode's s(τ_j)) both Eq. 7's α and Eq. 8's mean weigh
    each set by its weight (:mod:`mqttfl.engine.buffered`). ``personalized``: Eqs. 5-7's
    Q already summed while the uploads arrived (:mod:`mqttfl.algorithms.fedapa.fanin`).
    """
    prototypes = prototypes.astype(np.float32, copy=False)
    counts = mask.sum(axis=0)  # (C,)
    available = counts > 0
    held = mask.astype(np.float32)
    if weights is not None:  # Eq. 8's mean weighted by s(τ_j): Σ_j s_j p_j / Σ_j s_j
        held *= np.asarray(weights, np.float32)[:, None]
        counts = np.where(available, held.sum(axis=0), 1.0)
    class_mean = np.einsum("nc,ncd->cd", held, prototypes)
    class_mean /= np.maximum(counts, 1)[:, None] if weights is None else counts[:, None]
    if personalized is not None:
        q = personalized
    elif similarity:
        q = personalized_prototypes(prototypes, mask, tau, weights)
    else:
        q = np.broadcast_to(class_mean, prototypes.shape)
    missing = ~mask[:, :, None]
    q = np.where(missing, class_mean[None], q).astype(np.float32, copy=False)
    padded = np.where(missing, class_mean[None], prototypes).astype(np.float32, copy=False)
    return q, padded, available


def prototype_contrast(
    embedding: Tensor,
    anchors: Tensor,
    y: Tensor,
    available: Tensor,
    tau: float,
    set_weights: Tensor | None = None,
) -> Tensor:
    """Eqs. 9-10: E[-log softmax_ŷ(cos(r(h), a^ŷ)/τ)[y]] over the available classes.

    ``anchors`` is (C, d) for L_g or (N, C, d) for L_c; for the latter the loss is the
    mean over the N prototype sets (the 1/N Σ_j of Eq. 10), or with ``set_weights``
    (M,) the weighted sum over M sampled sets (the bounded downlink's estimate of it).
    """
    keep = available[y]
    if not bool(keep.any()):
        return embedding.sum() * 0.0
    z = F.normalize(embedding[keep], dim=1)
    target = y[keep]
    sets = anchors if anchors.dim() == 3 else anchors.unsqueeze(0)
    unit = F.normalize(sets, dim=2)
    logits = torch.einsum("bd,ncd->nbc", z, unit) / tau
    logits = logits.masked_fill(~available.view(1, 1, -1), float("-inf"))
    n = logits.shape[0]
    if set_weights is None:
        return F.cross_entropy(logits.reshape(-1, logits.shape[2]), target.repeat(n))
    per_set = F.cross_entropy(
        logits.reshape(-1, logits.shape[2]), target.repeat(n), reduction="none"
    ).view(n, -1)
    return (set_weights.to(per_set.dtype) * per_set.mean(dim=1)).sum()
