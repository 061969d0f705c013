"""FedAPA: adaptive prototype aggregation (Guo, Mao and Ho, "FedAPA: Federated
Learning with Adaptive Prototype Aggregation Toward Heterogeneous Wi-Fi CSI-based Crowd
Counting", arXiv:2511.21048).

Clients share class prototypes only (Eq. 4): no per-class sample counts, since the
server never reads them (Eq. 8 pads with the plain mean over holders), and a label
histogram is more than the paper's privacy argument (prototypes only) hands over. The
server weighs peers' prototypes by cosine similarity (Eq. 5) through a softmax with
temperature τ (Eq. 6) into one personalized prototype set Q_i per client (Eq. 7), pads
the classes a client lacks with the mean over the clients that have them in both Q_i
and P_i (Eq. 8), and returns Q_i to client i and the full padded set P to everyone
(Algorithm 1). The client adds λ_t·(L_g + L_c) to its cross-entropy (Eq. 12), where
L_g aligns embeddings with Q_i (Eq. 9), L_c with every client's P_j (Eq. 10), and λ_t
follows the cosine warm-up of Eq. 11 (Algorithm 2).

**Bounded downlinks** (:mod:`mqttfl.algorithms.peer_sampling`). With more than k+1
uploads (k = ``max_peer_sets``) the broadcast carries a sample S of k+1 padded sets, by
default one per stratum of similar sets as int8, and client i's personal downlink the
weights of its L_c: an unbiased estimate of Eq. 10's (1/N)·Σ_j at a bounded size. With
N ≤ k+1, S is every set with no weights, exactly Algorithm 1 (the default 6-client job).

The two Table IV ablations reuse this module: ``fedapa-global-avg`` replaces Eqs. 5-7
with one plain mean per class and drops L_c; ``fedapa-global-avg-client-protos`` keeps
the plain mean and keeps L_c.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import (
    Algorithm,
    ClientSide,
    Context,
    Downlinks,
    ServerSide,
    Upload,
    expect_array,
)
from mqttfl.algorithms.fedapa_fanin import FanIn
from mqttfl.algorithms.peer_sampling import (
    dequantize_sets,
    own_set_sums,
    quantize_sets,
    rebuild_own_set,
    sample_weights,
    set_strata,
    shared_sample,
    strata_weights,
    stratified_sample,
)
from mqttfl.algorithms.prototype_uploads import class_statistics, prototype_schema, stack_uploads
from mqttfl.errors import WireError
from mqttfl.logs import get_logger
from mqttfl.training.lazy import lazy_import
from mqttfl.training.loops import embed_all
from mqttfl.wire.schemas import ClientInfo, PayloadSchema

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import Tensor
else:
    torch = lazy_import("torch")
    F = lazy_import("torch.nn.functional")

#: the paper's default T_warm (stated under Eq. 11)
PAPER_WARMUP_ROUNDS = 50


class FedAPAParams(BaseModel):
    """Defaults are the paper's: τ=0.5, λ from 0 to 1 over T_warm=50 rounds.

    Left unset, ``warmup_rounds`` is the paper's 50 capped at half the run
    (:func:`warmup_length`), so a run shorter than 100 rounds still reaches λ_max and
    spends its second half there; set it to pin T_warm.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    tau: float = Field(0.5, gt=0)
    lambda_min: float = Field(0.0, ge=0)
    lambda_max: float = Field(1.0, ge=0)
    warmup_rounds: int | None = Field(None, ge=1)
    aggregation: Literal["similarity", "mean"] = "similarity"
    use_client_prototypes: bool = True
    # k: above k+1 uploads, the broadcast carries k+1 sampled sets, not all N
    max_peer_sets: int = Field(8, ge=1)
    # How the sets are drawn above k+1 uploads: one per stratum of similar sets, for
    # `strata` strata, sent as int8 with per-class scales (low variance, see
    # mqttfl.algorithms.peer_sampling; 40 keep a client's downlink under 300 KB at C=21,
    # d=256); or k+1 uniformly, as float32 (the earlier design, kept for comparison).
    sampling: Literal["strata", "uniform"] = "strata"
    strata: int = Field(40, ge=1)


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
    Q already summed while the uploads arrived (:mod:`mqttfl.algorithms.fedapa_fanin`).
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


class FedAPAServer(ServerSide):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.warmup_rounds = warmup_length(ctx.rounds, ctx.params.warmup_rounds)
        self.fan_in: FanIn | None = None
        if self.warmup_rounds > ctx.rounds:
            get_logger().warning(
                "fedapa.warmup_exceeds_run",
                warmup_rounds=self.warmup_rounds,
                rounds=ctx.rounds,
                reason="λ_t never reaches lambda_max in this run",
            )

    def round_params(self, t: int) -> dict[str, Any]:
        p: FedAPAParams = self.ctx.params
        lam = warmup_lambda(
            t, lambda_min=p.lambda_min, lambda_max=p.lambda_max, warmup_rounds=self.warmup_rounds
        )
        return {"lambda": lam}

    def prepare(self, t: int, upload: Upload) -> None:
        """Sum Eqs. 5-7's pairs while round ``t``'s uploads arrive (synchronous rounds)."""
        p: FedAPAParams = self.ctx.params
        if p.aggregation != "similarity" or self.upload_weights:
            return
        if self.fan_in is None or self.fan_in.t != t:
            self.fan_in = FanIn(t, self.ctx.num_classes, self.ctx.embed_dim, p.tau)
        self.fan_in.add(upload.client_id, upload.body)

    def aggregate(self, t: int, uploads: list[Upload]) -> Downlinks:
        p: FedAPAParams = self.ctx.params
        fan_in, self.fan_in, early = self.fan_in, None, None
        clients = [u.client_id for u in uploads]
        if (
            fan_in
            and not self.upload_weights
            and fan_in.covers(t, clients, [u.body for u in uploads])
        ):
            early, protos, mask = fan_in.personalized(clients)
        else:  # another set than arrived (a resumed round, a dropped offender), or weighted
            protos, mask = stack_uploads(uploads, self.ctx.num_classes, self.ctx.embed_dim)
        stale = [self.upload_weights.get(u.client_id, 1.0) for u in uploads]
        q, padded, available = aggregate_prototypes(
            protos,
            mask,
            tau=p.tau,
            similarity=p.aggregation == "similarity",
            weights=np.asarray(stale) if self.upload_weights else None,
            personalized=early,
        )
        broadcast: dict[str, Any] = {"available": available.astype(np.uint8)}
        personal: dict[str, dict[str, Any]] = {u.client_id: {} for u in uploads}
        n, k = len(uploads), p.max_peer_sets
        if p.use_client_prototypes and n <= k + 1:
            broadcast["prototypes"] = padded  # exact Eq. 10: every set, once
        elif p.use_client_prototypes and p.sampling == "strata":  # bounded, stratified
            labels = set_strata(padded, p.strata, seed=self.ctx.seed, t=t)
            reps, alts = stratified_sample(labels, seed=self.ctx.seed, t=t)
            broadcast["prototypes_int8"], broadcast["prototypes_scale"] = quantize_sets(
                padded[reps]
            )
            sums = own_set_sums(padded)
            for row, upload in enumerate(uploads):
                weights, extra = strata_weights(labels, reps, alts, row)
                body = {"own_sums": sums[row], "set_weights": weights}
                if extra is not None:
                    body["extra"] = padded[extra][None]
                personal[upload.client_id] = body
        elif p.use_client_prototypes:  # bounded: one uniform sample, own set and weights
            sample = shared_sample(n, k + 1, seed=self.ctx.seed, t=t)
            broadcast["prototypes"] = padded[sample]
            sums = own_set_sums(padded)
            for row, upload in enumerate(uploads):
                personal[upload.client_id] = {
                    "own_sums": sums[row],
                    "set_weights": sample_weights(n, sample, row),
                }
        if p.aggregation == "mean":  # one global set: send it once, not per client
            broadcast["global"] = q[0] if len(q) else q.reshape(0, self.ctx.embed_dim)
        else:
            for row, upload in enumerate(uploads):
                personal[upload.client_id]["q"] = q[row]
        return Downlinks(broadcast=broadcast, personal={c: b for c, b in personal.items() if b})


class FedAPAClient(ClientSide):
    supports_privacy = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.q: Tensor | None = None  # (C, d) personalized Q_i
        self.p: Tensor | None = None  # (N, C, d) padded P, or (k+2, C, d): P_i and S
        self.p_weights: Tensor | None = None  # (k+2,) their weights, with a sample
        self.available: Tensor | None = None  # (C,) bool
        self.sent: tuple[np.ndarray, np.ndarray] | None = None  # the last upload, for P_i

    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return prototype_schema(ctx)

    def loss(
        self, t: int, params: dict[str, Any], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        """Eq. 12: L = L_ce + λ_t (L_g(Q_i) + L_c(P))."""
        loss = F.cross_entropy(logits, y)
        lam = float(params.get("lambda", 0.0))
        if lam <= 0.0 or self.q is None or self.available is None:
            return loss
        tau = self.ctx.params.tau
        extra = prototype_contrast(embedding, self.q, y, self.available, tau)
        if self.p is not None:
            extra = extra + prototype_contrast(
                embedding, self.p, y, self.available, tau, self.p_weights
            )
        return loss + lam * extra

    def make_upload(self, t: int) -> dict[str, Any]:
        """Eq. 4 over the local training set with the freshly trained encoder; the
        per-class counts stay on the device. With [privacy] on, the clipped and noised
        class means of :func:`class_statistics` (mqttfl/privacy/mechanism.py)."""
        embeddings = embed_all(self.model, self.shard.x_train)
        classes, protos, _ = class_statistics(self, embeddings, self.shard.y_train)
        self.sent = (classes, protos)
        return self.declared({"classes": classes, "prototypes": protos})

    def check_downlink(self, broadcast: dict[str, Any], personal: dict[str, Any] | None) -> None:
        c, d = self.ctx.num_classes, self.ctx.embed_dim
        expect_array(broadcast, "available", (c,), kind="biu")
        expect_array(broadcast, "prototypes", (None, c, d))
        quantized = expect_array(broadcast, "prototypes_int8", (None, c, d), kind="i")
        scale = expect_array(broadcast, "prototypes_scale", (None, c))
        if (quantized is None) != (scale is None) or (
            quantized is not None and scale is not None and len(quantized) != len(scale)
        ):
            raise WireError("missing_field", "int8 sets come with one scale per set and class")
        expect_array(broadcast, "global", (c, d))
        mine = personal or {}
        expect_array(mine, "q", (c, d))
        own = expect_array(mine, "own", (c, d))  # sent in full by coordinators before 0.9
        sums = expect_array(mine, "own_sums", (c,))
        expect_array(mine, "extra", (None, c, d))
        weights = expect_array(mine, "set_weights", (None,))
        if (own is None and sums is None) != (weights is None):
            raise WireError("missing_field", "the own set comes with the sample's weights")
        if weights is not None and (weights < 0).any():
            raise WireError("range", "negative sample weights")

    def receive(self, t: int, broadcast: dict[str, Any], personal: dict[str, Any] | None) -> None:
        if "available" not in broadcast:
            return
        self.available = torch.from_numpy(broadcast["available"].astype(bool))
        self.p, self.p_weights = None, None
        sets = broadcast.get("prototypes")
        if "prototypes_int8" in broadcast:
            sets = dequantize_sets(broadcast["prototypes_int8"], broadcast["prototypes_scale"])
        if "global" in broadcast:
            self.q = torch.from_numpy(broadcast["global"])
        elif personal is not None and "q" in personal:
            self.q = torch.from_numpy(personal["q"])
        if personal is not None and "set_weights" in personal:  # [P_i, *S, *extra], weighted
            self._receive_sample(t, sets, personal)
        elif sets is not None:
            self.p = torch.from_numpy(sets)

    def _receive_sample(self, t: int, sets: np.ndarray | None, personal: dict[str, Any]) -> None:
        weights = personal["set_weights"]
        own = personal.get("own")
        if own is None and self.sent is not None and self.q is not None:
            own = rebuild_own_set(*self.sent, self.q.numpy(), personal["own_sums"])
        if own is None:  # a restart or a stale upload: this round's L_c is left out
            get_logger().warning(
                "downlink.inconsistent", round=t, reason="the own set is not the upload kept"
            )
            return
        extra = personal.get("extra", np.zeros((0, *own.shape), np.float32))
        if sets is not None and len(weights) == len(sets) + 1 + len(extra):
            self.p = torch.from_numpy(np.concatenate([own[None], sets, extra]))
            self.p_weights = torch.from_numpy(weights)
        else:
            get_logger().warning(
                "downlink.inconsistent", round=t, reason="sample weights do not fit S"
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            name: value.numpy()
            for name, value in (
                ("q", self.q),
                ("p", self.p),
                ("p_weights", self.p_weights),
                ("available", self.available),
            )
            if value is not None
        } | ({"sent_classes": self.sent[0], "sent": self.sent[1]} if self.sent else {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("q", "p", "p_weights", "available"):
            if name in state:
                setattr(self, name, torch.from_numpy(np.asarray(state[name])))
        if "sent" in state and "sent_classes" in state:
            self.sent = (np.asarray(state["sent_classes"]), np.asarray(state["sent"]))


class GlobalAvgParams(FedAPAParams):
    """Table IV, row 1: one global mean prototype per class, no L_c."""

    aggregation: Literal["similarity", "mean"] = "mean"
    use_client_prototypes: bool = False


class GlobalAvgClientProtosParams(FedAPAParams):
    """Table IV, row 2: one global mean prototype per class, with L_c."""

    aggregation: Literal["similarity", "mean"] = "mean"


ALGORITHMS = (
    Algorithm(
        "fedapa",
        FedAPAServer,
        FedAPAClient,
        FedAPAParams,
        summary="similarity-weighted personalized prototypes (FedAPA)",
    ),
    Algorithm(
        "fedapa-global-avg",
        FedAPAServer,
        FedAPAClient,
        GlobalAvgParams,
        summary="FedAPA ablation: global mean prototypes, no L_c",
    ),
    Algorithm(
        "fedapa-global-avg-client-protos",
        FedAPAServer,
        FedAPAClient,
        GlobalAvgClientProtosParams,
        summary="FedAPA ablation: global mean prototypes with L_c",
    ),
)
