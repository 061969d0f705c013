"""FedSAP: scheduled alignment and proxy separation ("Closing the Alignment-Maturity Gap
in Federated Prototype Learning", arXiv:2606.02172).

Same protocol as FedProto: clients upload class prototypes (Eq. 1), the server returns
the bank of class-wise means over the clients that observed each class (Eq. 2). The
client's loss is Eq. 3, L = L_CE + λ_t·L_Proto + L_Proxy, with L_Proto the distance to
the global prototype (Eq. 5, see ``proto_distance``) and L_Proxy a cosine-softmax with
scale s over the normalized embedding and prototypes (Eqs. 8-9). λ_t follows the
curriculum of Eq. 7 with the appendix's start round: zero up to r_start, then rising to
``sap_lambda_max`` (0.7) at the last round; the ramp's shape is configurable (linear,
cosine, sigmoid, step, or constant = no curriculum; Appendix A.1 and Table 4).

r_start is relative to the run: the appendix starts at round 20 of 100, so r_start =
⌊``sap_start_fraction``·T⌋ with the fraction 0.2, and every run of T ≥ 2 rounds has
λ_t > 0 in its last rounds (an absolute round 20 left λ_t = 0 in every round of a
20-round run). ``sap_start_round`` gives an absolute r_start instead.

Eq. 5 writes L_Proto = ‖f(x_i) - p̄_c‖₂², and the text calls it "this MSE formulation".
``proto_distance = "mse"`` (the default) divides it by d, as torch's MSE in FedProto's
reference code does; ``"squared"`` is the equation as printed (d times larger: 128 for the
digits CNN). MSE is the default because (1) FedSAP keeps FedProto's protocol and its
baselines follow their reference code, so λ_max = 0.7 was set against that scale, and
(2) on a validation split of configs/digits-fedsap.toml (25% of each client's training
data, 30 rounds, seeds 0-2) MSE scored 92.8% mean client accuracy and the squared form
84.1% (no alignment at all: 92.4%); on the synthetic CSI rooms (d = 256, 20 rounds,
32-step windows, 160 samples per client) 33.9% against 24.5%, the squared form
collapsing to 4.4% for one seed of three.

Semi-supervised phase (Sec. 3.6, ``semi_supervised = true``): each client holds back
``unlabelled_fraction`` of its own training shard as an unlabelled pool. After
``supervised_rounds`` rounds it calibrates the margin M and distance D_max of Eq. 11
from its labelled data, then trains on Eq. 13 = Eq. 3 + λ_Cons·L_Cons: unlabelled
samples get the nearest-prototype pseudo-label of a weakly augmented view (Eq. 10),
are accepted by Eq. 11, and a strongly augmented view is pulled to the prototype by a
cosine consistency loss (Eq. 12). Its uploads become the mixed prototypes of Eq. 14.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import Algorithm, Context
from mqttfl.algorithms.common.prototypes import (
    BankServer,
    Inference,
    ProtoDistance,
    PrototypeClient,
    prototype_distance,
)
from mqttfl.logs import get_logger
from mqttfl.training.lazy import F, torch
from mqttfl.training.loops import batches, embed_all, train_epochs
from mqttfl.wire.control import Number
from mqttfl.wire.ids import client_number
from mqttfl.wire.schemas import Body

if TYPE_CHECKING:
    from torch import Tensor

Schedule = Literal["linear", "cosine", "sigmoid", "step", "constant"]
_SIGMOID_STEEPNESS = 10.0


class FedSAPParams(BaseModel):
    """Paper defaults (Appendix A): M=0.7 from round 20 of 100 to the last round, s=32.

    The start is kept as the paper's fraction of the run (0.2), so shorter runs still
    ramp; ``sap_start_round`` pins it to an absolute round. λ_Cons, α and the
    calibration quantile are not given in the paper.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    sap_lambda_max: float = Field(0.7, ge=0)
    sap_start_fraction: float = Field(0.2, ge=0, lt=1)  # r_start = ⌊fraction·T⌋
    sap_start_round: int | None = Field(None, ge=0)  # an absolute r_start (overrides)
    sap_end_round: int | None = Field(None, ge=1)  # None: the run's last round
    proto_distance: ProtoDistance = "mse"  # Eq. 5 ÷ d; see the module docstring
    sap_schedule: Schedule = "linear"
    proxy_scale: float = Field(32.0, gt=0)
    use_proxy: bool = True
    inference: Inference = "head"
    semi_supervised: bool = False
    supervised_rounds: int = Field(100, ge=1)  # T_sup
    unlabelled_fraction: float = Field(0.5, gt=0, lt=1)
    cons_lambda: float = Field(1.0, ge=0)  # λ_Cons, Eq. 13
    pseudo_alpha: float = Field(0.5, ge=0)  # α, Eq. 14
    threshold_quantile: float = Field(0.9, gt=0, lt=1)  # Eq. 11 calibration


def curriculum_start(rounds: int, *, fraction: float, absolute: int | None = None) -> int:
    """r_start of Eq. 7: ``absolute`` if given, else ⌊fraction·T⌋ (Appendix A.1's 20 of
    T=100 is fraction 0.2). With a fraction below 1, r_start < T for every T ≥ 1."""
    if absolute is not None:
        return absolute
    return math.floor(fraction * rounds)


def curriculum_lambda(
    t: int, *, lambda_max: float, start_round: int, end_round: int, shape: Schedule = "linear"
) -> float:
    """Eq. 7 with a start round: λ_t = M·ramp(u), u = clip((t - r_start)/(T - r_start), 0, 1).

    linear: u; cosine: (1 - cos πu)/2; sigmoid: a logistic in u rescaled to 0 at u=0 and 1
    at u=1; step: 1 as soon as t > r_start; constant: 1 from the first round (no curriculum).
    """
    if shape == "constant":
        return lambda_max
    if t <= start_round:
        return 0.0
    if shape == "step" or end_round <= start_round:
        return lambda_max
    u = min(1.0, (t - start_round) / (end_round - start_round))
    if shape == "linear":
        ramp = u
    elif shape == "cosine":
        ramp = (1.0 - math.cos(math.pi * u)) / 2.0
    else:
        k = _SIGMOID_STEEPNESS
        low, high = 1 / (1 + math.exp(k / 2)), 1 / (1 + math.exp(-k / 2))
        ramp = (1 / (1 + math.exp(-k * (u - 0.5))) - low) / (high - low)
    return lambda_max * ramp


def proxy_loss(
    embedding: Tensor, bank: Tensor, y: Tensor, available: Tensor, scale: float
) -> Tensor:
    """Eqs. 8-9: -1/|B| Σ_i log softmax_c(s·ĥ_i·p̂_c)[y_i], over the classes in the bank."""
    keep = available[y]
    if not bool(keep.any()):
        return embedding.sum() * 0.0
    logits = scale * F.normalize(embedding[keep], dim=1) @ F.normalize(bank, dim=1).T
    logits = logits.masked_fill(~available.view(1, -1), float("-inf"))
    return F.cross_entropy(logits, y[keep])


def cosine_distances(embedding: Tensor, bank: Tensor, available: Tensor) -> Tensor:
    """1 - cos(h, p̂_c) for every available class; +inf for the others."""
    d = 1.0 - F.normalize(embedding, dim=1) @ F.normalize(bank, dim=1).T
    return d.masked_fill(~available.view(1, -1), float("inf"))


def _two_nearest(distances: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    k = min(2, distances.shape[1])
    values, index = distances.topk(k, dim=1, largest=False)
    second = values[:, 1] if k == 2 else torch.full_like(values[:, 0], float("inf"))
    return index[:, 0], values[:, 0], second


def pseudo_labels(
    weak_embedding: Tensor, bank: Tensor, available: Tensor, *, margin: float, max_distance: float
) -> tuple[Tensor, Tensor]:
    """Eq. 10: ĉ_u = argmin_c (1 - cos(h̃_u, p̂_c)); Eq. 11: accept iff
    d(x_u, p') - d(x_u, p) > M and d(x_u, p) < D_max (p nearest, p' second nearest)."""
    label, nearest, second = _two_nearest(cosine_distances(weak_embedding, bank, available))
    accept = ((second - nearest) > margin) & (nearest < max_distance)
    return label, accept


def calibrate_thresholds(
    embedding: Tensor, y: Tensor, bank: Tensor, available: Tensor, quantile: float
) -> tuple[float, float]:
    """Eq. 11's (M, D_max) from labelled data: D_max is the ``quantile`` of the true-class
    distances, M the (1 - ``quantile``) quantile of the nearest-vs-second margins of the
    samples whose nearest prototype is their own class (M = 0 if there are none)."""
    keep = available[y]
    distances = cosine_distances(embedding[keep], bank, available)
    target = y[keep]
    true_distance = distances.gather(1, target.view(-1, 1)).squeeze(1)
    label, nearest, second = _two_nearest(distances)
    correct = (label == target) & torch.isfinite(second)
    d_max = float(torch.quantile(true_distance, quantile)) if len(true_distance) else 2.0
    margins = (second - nearest)[correct]
    margin = float(torch.quantile(margins, 1.0 - quantile)) if len(margins) else 0.0
    return margin, d_max


def consistency_loss(strong_embedding: Tensor, bank: Tensor, labels: Tensor) -> Tensor:
    """Eq. 12: 1/|A| Σ_{u∈A} (1 - ĥ_u^(s)·p̂_{ĉ_u})."""
    cos = (F.normalize(strong_embedding, dim=1) * F.normalize(bank[labels], dim=1)).sum(dim=1)
    return (1.0 - cos).mean()


def mixed_prototypes(
    labelled: np.ndarray, y: np.ndarray, strong: np.ndarray, pseudo: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. 14: p_c = norm((Σ_{L_c} h_i + α Σ_{A_c} h_j^(s)) / (|L_c| + α|A_c|)).

    Returns (classes, L2-normalized prototypes, |L_c| + |A_c|) over the classes seen in
    either set.
    """
    classes = np.union1d(y, pseudo).astype(np.int64)
    dim = labelled.shape[1] if labelled.size else strong.shape[1]
    sums = np.zeros((len(classes), dim))
    weight = np.zeros(len(classes))
    counts = np.zeros(len(classes), np.int64)
    for source, labels, w in ((labelled, y, 1.0), (strong, pseudo, alpha)):
        rows = np.searchsorted(classes, labels)
        np.add.at(sums, rows, w * source)
        np.add.at(weight, rows, w)
        np.add.at(counts, rows, 1)
    means = sums / np.maximum(weight, 1e-12)[:, None]
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return classes, (means / np.maximum(norms, 1e-12)).astype(np.float32), counts


# --- augmentations of CSI windows (the paper's are for images; these are ours) ---------
def _augment(
    x: np.ndarray, rng: np.random.Generator, *, jitter: float, mask_fraction: float
) -> np.ndarray:
    """Per-sample gain change and additive noise (both ∝ ``jitter``), then a random
    contiguous span of ``mask_fraction`` of the first sample axis set to the sample mean."""
    axes = tuple(range(1, x.ndim))
    shape = (len(x),) + (1,) * (x.ndim - 1)
    gain = 1.0 + jitter * rng.standard_normal(shape)
    spread = x.std(axis=axes, keepdims=True)
    out = x * gain + jitter * spread * rng.standard_normal(x.shape)
    span = round(mask_fraction * x.shape[1])
    if span:
        mean = x.mean(axis=axes, keepdims=True)
        for i, start in enumerate(rng.integers(0, x.shape[1] - span + 1, size=len(x))):
            out[i, start : start + span] = mean[i]
    return cast("np.ndarray", out.astype(np.float32))


def weak_view(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return _augment(x, rng, jitter=0.05, mask_fraction=0.0)


def strong_view(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return _augment(x, rng, jitter=0.2, mask_fraction=0.25)


def _cycle(n: int, size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    while True:
        order = rng.permutation(n)
        for start in range(0, n, size):
            yield order[start : start + size]


class FedSAPServer(BankServer):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        p: FedSAPParams = ctx.params
        self.start_round = curriculum_start(
            ctx.rounds, fraction=p.sap_start_fraction, absolute=p.sap_start_round
        )
        if p.sap_schedule != "constant" and self.start_round >= ctx.rounds:
            get_logger().warning(
                "fedsap.curriculum_inactive",
                start_round=self.start_round,
                rounds=ctx.rounds,
                reason="λ_t is 0 in every round: sap_start_round is not before the last round",
            )

    def round_params(self, t: int) -> dict[str, Number]:
        p: FedSAPParams = self.ctx.params
        lam = curriculum_lambda(
            t,
            lambda_max=p.sap_lambda_max,
            start_round=self.start_round,
            end_round=p.sap_end_round or self.ctx.rounds,
            shape=p.sap_schedule,
        )
        return {"lambda": lam, "semi": p.semi_supervised and t > p.supervised_rounds}


class FedSAPClient(PrototypeClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p: FedSAPParams = self.ctx.params
        n = len(self.shard.y_train)
        self.labelled_index = np.arange(n)
        self.pool: np.ndarray | None = None  # the unlabelled pool (labels dropped)
        if p.semi_supervised:
            rng = np.random.default_rng([self.ctx.seed, 7, client_number(self.info.client_id)])
            order = rng.permutation(n)
            size = min(n - 1, int(p.unlabelled_fraction * n))
            self.pool = self.shard.x_train[np.sort(order[:size])]
            self.labelled_index = np.sort(order[size:])
        self.thresholds: tuple[float, float] | None = None  # (M, D_max) of Eq. 11
        self.semi_round = False

    def labelled(self) -> tuple[np.ndarray, np.ndarray]:
        return self.shard.x_train[self.labelled_index], self.shard.y_train[self.labelled_index]

    def supervised_loss(self, lam: float, logits: Tensor, embedding: Tensor, y: Tensor) -> Tensor:
        """Eq. 3: L_CE + λ_t·L_Proto + L_Proxy, L_Proto by ``proto_distance`` (Eq. 5)."""
        loss = F.cross_entropy(logits, y)
        if not self.has_bank():
            return loss
        assert self.bank is not None
        assert self.available is not None
        if lam > 0:
            loss = loss + lam * prototype_distance(
                embedding, self.bank, y, self.available, self.ctx.params.proto_distance
            )
        if self.ctx.params.use_proxy:
            loss = loss + proxy_loss(
                embedding, self.bank, y, self.available, self.ctx.params.proxy_scale
            )
        return loss

    def loss(
        self, t: int, params: Mapping[str, Number], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        return self.supervised_loss(float(params.get("lambda", 0.0)), logits, embedding, y)

    def train(self, t: int, params: Mapping[str, Number], rng: np.random.Generator) -> float:
        self.semi_round = (
            bool(params.get("semi", False)) and self.pool is not None and self.has_bank()
        )
        if not self.semi_round:
            x, y = self.labelled()
            return train_epochs(
                self.model,
                self.optimizer,
                x,
                y,
                lambda logits, z, yb: self.loss(t, params, logits, z, yb),
                epochs=self.train_config.local_epochs,
                batch_size=self.train_config.batch_size,
                rng=rng,
            )
        if self.thresholds is None:  # the end of the supervised phase
            self.thresholds = self.calibrate()
            get_logger().info(
                "fedsap.thresholds_calibrated",
                round=t,
                margin=round(self.thresholds[0], 6),
                max_distance=round(self.thresholds[1], 6),
            )
        return self._train_semi(t, float(params.get("lambda", 0.0)), rng)

    def calibrate(self) -> tuple[float, float]:
        assert self.bank is not None
        assert self.available is not None
        x, y = self.labelled()
        z = torch.from_numpy(embed_all(self.model, x))
        return calibrate_thresholds(
            z, torch.from_numpy(y), self.bank, self.available, self.ctx.params.threshold_quantile
        )

    def _train_semi(self, t: int, lam: float, rng: np.random.Generator) -> float:
        """Eq. 13 over labelled batches, each paired with a batch from the pool."""
        assert self.pool is not None
        assert self.bank is not None
        assert self.available is not None
        assert self.thresholds is not None
        margin, d_max = self.thresholds
        p: FedSAPParams = self.ctx.params
        x, y = self.labelled()
        size = self.train_config.batch_size
        unlabelled = _cycle(len(self.pool), size, rng)
        self.model.train()
        mean, seen, accepted = 0.0, 0, 0
        for _ in range(self.train_config.local_epochs):
            total, count = 0.0, 0
            for xb, yb in batches(x, y, size, rng):
                if len(yb) < 2 and count:
                    continue
                xu = self.pool[next(unlabelled)]
                n, m = len(yb), len(xu)
                views = torch.from_numpy(np.concatenate([weak_view(xu, rng), strong_view(xu, rng)]))
                logits, z = self.model(torch.cat([xb, views]))
                loss = self.supervised_loss(lam, logits[:n], z[:n], yb)
                labels, accept = pseudo_labels(
                    z[n : n + m].detach(),
                    self.bank,
                    self.available,
                    margin=margin,
                    max_distance=d_max,
                )
                seen, accepted = seen + m, accepted + int(accept.sum())
                if p.cons_lambda > 0 and bool(accept.any()):
                    strong = z[n + m :][accept]
                    loss = loss + p.cons_lambda * consistency_loss(
                        strong, self.bank, labels[accept]
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                self.optimizer.step()
                total += float(loss.detach()) * n
                count += n
            mean = total / max(count, 1)
        self.optimizer.zero_grad(set_to_none=True)  # a waiting client holds no gradients
        get_logger().info("fedsap.pseudo_labels", round=t, seen=seen, accepted=accepted)
        return mean

    def make_upload(self, t: int) -> Body:
        if not self.semi_round:
            return super().make_upload(t)
        assert self.pool is not None
        assert self.bank is not None
        assert self.available is not None
        assert self.thresholds is not None
        rng = np.random.default_rng([self.ctx.seed, t, client_number(self.info.client_id)])
        x, y = self.labelled()
        weak = torch.from_numpy(embed_all(self.model, weak_view(self.pool, rng)))
        strong = embed_all(self.model, strong_view(self.pool, rng))
        labels, accept = pseudo_labels(
            weak,
            self.bank,
            self.available,
            margin=self.thresholds[0],
            max_distance=self.thresholds[1],
        )
        keep = accept.numpy()
        if self.ctx.privacy is not None:  # every window counts once (α=1), then Eq. 14's norm
            classes, means, counts = self.class_statistics(
                np.concatenate([embed_all(self.model, x), strong[keep]]),
                np.concatenate([y, labels.numpy()[keep]]),
            )
            norms = np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
            return self.upload_body(classes, (means / norms).astype(np.float32), counts)
        return self.upload_body(
            *mixed_prototypes(
                embed_all(self.model, x),
                y,
                strong[keep],
                labels.numpy()[keep],
                self.ctx.params.pseudo_alpha,
            )
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        state = super().state_dict()
        if self.thresholds is not None:
            state["thresholds"] = np.asarray(self.thresholds, np.float64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        super().load_state_dict(state)
        if "thresholds" in state:
            margin, d_max = (float(v) for v in np.asarray(state["thresholds"]))
            self.thresholds = (margin, d_max)


ALGORITHMS = (
    Algorithm(
        "fedsap",
        FedSAPServer,
        FedSAPClient,
        FedSAPParams,
        summary="curriculum-scheduled prototype alignment + proxy separation (FedSAP)",
    ),
)
