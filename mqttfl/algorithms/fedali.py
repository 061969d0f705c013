"""FedAli: alignment with prototype layers (Ek, Wang, Portet, Lalanda and
Cao, "FedAli: Personalized Federated Learning Alignment with Prototype Layers for
Generalized Mobile Services").

The model must have ALP layers (``model.name = "transformer"``,
:mod:`mqttfl.models.transformer`). Each ALP layer l holds G_l local and G_l global
prototypes (``prototype_counts``); Algorithm 1 runs inside the model's forward pass:
Sinkhorn-Knopp (ε, 3 iterations) between the L2-normalized token embeddings and the
local and global prototypes together, a hard assignment to a global prototype, a GLU
under a stop-gradient, x̂ = β·P_GLU + (1-β)·x L2-normalized (Eq. 4), and an EMA update
of the local prototypes from their top-⌈BZ/G⌉ weighted embeddings (Eq. 5). Inference
matches the local prototypes only.

Server (Algorithm 2): the sample-weighted FedAvg of the weights (within groups of
identical architecture) and, per ALP layer, K-means with G_l clusters over every
client's local prototypes, initialized from their sample-weighted average; the
centroids are the next global prototypes. Local prototypes go up, global ones come
down: an upload never carries global prototypes and a downlink never local ones. In
round 1 every client starts from the same seeded prototypes, which stand in for the
server's initial P_global.

Scoring point and local recipe, as the authors run it (getalp/FedAli, ``fed_util.py``:
each round a client loads the server weights, fits, then evaluates the fitted model):
the model a client scores in round t is the one it trained in round t. The averaged
weights that come down are kept aside (:meth:`FedAliClient.receive`) and loaded at the
start of the next local training (:meth:`FedAliClient.train`), so a client is never
scored on the bare global model. Local training is the paper's (Sec. 5.1): a fresh
Adam (lr 1e-4) each round, 5 local epochs, batch 64 (``local_*`` parameters; set
``local_optimizer = "train"`` for the run's ``[train]`` SGD instead).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from mqttfl.algorithms.base import (
    Algorithm,
    Context,
    Downlinks,
    Upload,
    expect_array,
    expect_map,
)
from mqttfl.algorithms.common.weights import (
    ModelVersions,
    average_by_group,
    flatten_weights,
    group_key,
    load_weights,
    uploaded_weights,
    weights_length,
)
from mqttfl.algorithms.fedavg import FedAvgClient
from mqttfl.errors import ConfigError
from mqttfl.models.sizes import alp_widths
from mqttfl.privacy.mechanism import private_update
from mqttfl.training.lazy import F, torch
from mqttfl.training.loops import train_epochs
from mqttfl.training.optimizers import Adam, Optimizer
from mqttfl.wire.control import Number
from mqttfl.wire.schemas import ArrayField, Body, ClientInfo, IntField, PayloadSchema


class FedAliParams(BaseModel):
    """β=0.2, γ=0.999, ε=0.05 and 3 Sinkhorn iterations are the paper's (Sec. 5.1.3), and
    so is local training (Sec. 5.1): Adam with lr 1e-4, 5 local epochs, batch 64.

    The paper's counts (2048, 1024, ..., 64) are for six blocks of width 192; the default
    here halves from 64 for the two blocks of the CPU-sized transformer.
    ``local_optimizer = "train"`` trains with the run's ``[train]`` table (SGD, its lr,
    epochs and batch size) instead, e.g. to match FedAvg's recipe exactly.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    prototype_counts: tuple[PositiveInt, ...] = (64, 32)
    alp_beta: float = Field(0.2, ge=0, le=1)
    alp_gamma: float = Field(0.999, ge=0, le=1)
    sinkhorn_epsilon: float = Field(0.05, gt=0)
    sinkhorn_iterations: int = Field(3, ge=1)
    kmeans_iterations: int = Field(10, ge=1)
    local_optimizer: Literal["adam", "train"] = "adam"
    local_lr: float = Field(1e-4, gt=0)  # Adam's learning rate
    local_epochs: int = Field(5, ge=1)
    local_batch_size: int = Field(64, ge=1)


def local_key(layer: int) -> str:
    return f"local_{layer}"


def _check_layers(ctx: Context, arch: str) -> tuple[int, ...]:
    widths = alp_widths(arch)
    counts = ctx.params.prototype_counts
    if not widths:
        raise ConfigError(
            "model.name", f"fedali needs a model with ALP layers (transformer), not {arch!r}"
        )
    if len(counts) != len(widths):
        raise ConfigError(
            "method.prototype_counts",
            f"{len(counts)} counts for the {len(widths)} ALP layers of {arch!r}",
        )
    return widths


def weighted_mean_prototypes(stacked: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """P_centroid = Σ_c (n_c/n) P_c over clients, prototype by prototype: (N, G, d) -> (G, d)."""
    w = np.asarray(counts, dtype=np.float64)
    return cast("np.ndarray", np.einsum("n,ngd->gd", w / w.sum(), stacked.astype(np.float64)))


def global_prototypes(stacked: np.ndarray, counts: np.ndarray, *, iterations: int) -> np.ndarray:
    """Algorithm 2, line 11: K-means over all N·G local prototypes with G clusters,
    started from the sample-weighted mean; an emptied cluster keeps its start."""
    from scipy.cluster.vq import kmeans2  # on first use: 0.3 s of every import otherwise

    n, g, d = stacked.shape
    start = weighted_mean_prototypes(stacked, counts)
    with warnings.catch_warnings():  # scipy warns when a cluster empties; we keep its start
        warnings.simplefilter("ignore", UserWarning)
        centroids, _ = kmeans2(
            stacked.reshape(n * g, d).astype(np.float64),
            start,
            iter=iterations,
            minit="matrix",
            missing="warn",
        )
    return cast("np.ndarray", centroids.astype(np.float32))


class FedAliServer(ModelVersions):
    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        p: FedAliParams = self.ctx.params
        samples = {u.client_id: float(uploaded_weights(u)["num_samples"]) for u in uploads}
        counts = np.array([samples[u.client_id] for u in uploads])
        shared = {
            str(layer): global_prototypes(
                np.stack([cast("np.ndarray", u.body[local_key(layer)]) for u in uploads]),
                counts,
                iterations=p.kmeans_iterations,
            )
            for layer in range(len(p.prototype_counts))
        }
        return Downlinks(
            broadcast={"weights": average_by_group(uploads, samples), "global": shared}
        )


class FedAliClient(FedAvgClient):
    """Trains from the latest averaged weights, is scored on what it trained."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p: FedAliParams = self.ctx.params
        _check_layers(self.ctx, self.info.arch)
        self.next_weights: np.ndarray | None = None  # w_r, loaded when training starts
        self.layers = self.model.alp_layers()  # type: ignore[operator]
        for index, (layer, count) in enumerate(zip(self.layers, p.prototype_counts, strict=True)):
            generator = torch.Generator().manual_seed(self.ctx.seed * 1000 + index)
            start = torch.randn(count, layer.dim, generator=generator)
            layer.attach(
                start,
                start,
                beta=p.alp_beta,
                gamma=p.alp_gamma,
                epsilon=p.sinkhorn_epsilon,
                iterations=p.sinkhorn_iterations,
            )
        # the seeded initial local prototypes: DP-FedAvg's start before any round has run
        self.local_start = [layer.local.numpy().copy() for layer in self.layers]

    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        """Weights, sample count and each layer's local prototypes; no global ones."""
        widths = _check_layers(ctx, info.arch)
        fields: dict[str, Any] = {
            "weights": ArrayField("float32", (weights_length(ctx, info),)),
            "num_samples": IntField(1, 10**9),
        }
        for layer, (count, width) in enumerate(
            zip(ctx.params.prototype_counts, widths, strict=True)
        ):
            fields[local_key(layer)] = ArrayField("float32", (count, width))
        return PayloadSchema(fields)

    def make_upload(self, t: int) -> Body:
        """Weights, sample count and each ALP layer's local prototypes. With [privacy]
        on, DP-FedAvg over everything trained on the device: the weights and the local
        prototypes form one update since the round's start, clipped to C as a whole and
        noised (mqttfl/privacy/mechanism.py); the sample count is the constant 1."""
        locals_ = [layer.local.numpy().copy() for layer in self.layers]
        weights, samples = flatten_weights(self.model), len(self.shard.y_train)
        privacy = self.ctx.privacy
        if privacy is not None and self.start is not None:
            sizes = np.cumsum([weights.size] + [p.size for p in locals_])[:-1]
            noisy = private_update(
                np.concatenate([weights, *(p.ravel() for p in locals_)]),
                np.concatenate([self.start, *(p.ravel() for p in self.local_start)]),
                clip=privacy.clip,
                noise_multiplier=privacy.noise_multiplier,
                rng=self.noise(),
            )
            parts = np.split(noisy, sizes)
            weights, samples = parts[0], 1
            locals_ = [part.reshape(p.shape) for part, p in zip(parts[1:], locals_, strict=True)]
        body = {local_key(index): local for index, local in enumerate(locals_)}
        return self.declared({"weights": weights, "num_samples": samples, **body})

    def check_downlink(self, broadcast: Body, personal: Body | None) -> None:
        super().check_downlink(broadcast, personal)
        shared = expect_map(broadcast, "global")
        for index, layer in enumerate(self.layers):
            expect_array(shared, str(index), tuple(layer.shared.shape))

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        """Keep w_{r+1} for the next local training (Algorithm 2, line 4) without loading
        it: the evaluation that follows scores the model trained this round, as the
        official code does. P_global only acts in training, so it is taken at once."""
        length = weights_length(self.ctx, self.info)
        weights = expect_array(expect_map(broadcast, "weights"), group_key(self.info), (length,))
        if weights is not None:
            self.next_weights = np.asarray(weights, np.float32)
        for index, layer in enumerate(self.layers):
            shape = tuple(layer.shared.shape)
            shared = expect_array(expect_map(broadcast, "global"), str(index), shape)
            if shared is not None:
                layer.shared = torch.from_numpy(np.asarray(shared, np.float32))

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """The model trained in round ``t`` (not the averaged weights kept for the next
        round), its ALP layers matching tokens to the local prototypes in eval mode."""
        return super().evaluation_model(t)

    def local_optimizer(self) -> Optimizer:
        """A fresh Adam(lr) per round, as the official code compiles one per round; or the
        run's persistent ``[train]`` SGD with ``local_optimizer = "train"``."""
        p: FedAliParams = self.ctx.params
        if p.local_optimizer == "train":
            return self.optimizer
        return Adam(self.model.parameters(), lr=p.local_lr)

    def train(self, t: int, params: Mapping[str, Number], rng: np.random.Generator) -> float:
        """localTrainALP (Algorithm 2, line 6): start from w_r, then fit with CE."""
        if self.next_weights is not None:
            load_weights(self.model, self.next_weights)
            self.next_weights = None
        if self.ctx.privacy is not None:  # DP-FedAvg's θ_start: what this round starts from
            self.start = flatten_weights(self.model)
            self.local_start = [layer.local.numpy().copy() for layer in self.layers]
        p: FedAliParams = self.ctx.params
        recipe = p.local_optimizer == "train"
        return train_epochs(
            self.model,
            self.local_optimizer(),
            self.shard.x_train,
            self.shard.y_train,
            lambda logits, z, y: F.cross_entropy(logits, y),
            epochs=self.train_config.local_epochs if recipe else p.local_epochs,
            batch_size=self.train_config.batch_size if recipe else p.local_batch_size,
            rng=rng,
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {}
        for index, layer in enumerate(self.layers):
            state[f"local_{index}"] = layer.local.numpy().copy()
            state[f"global_{index}"] = layer.shared.numpy().copy()
        if self.next_weights is not None:
            state["next_weights"] = self.next_weights
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        for index, layer in enumerate(self.layers):
            if f"local_{index}" in state:
                layer.local = torch.from_numpy(np.asarray(state[f"local_{index}"], np.float32))
                layer.shared = torch.from_numpy(np.asarray(state[f"global_{index}"], np.float32))
        if "next_weights" in state:
            self.next_weights = np.asarray(state["next_weights"], np.float32)


ALGORITHMS = (
    Algorithm(
        "fedali",
        FedAliServer,
        FedAliClient,
        FedAliParams,
        summary="ALP layers: local/global prototypes, FedAvg + K-means (FedAli)",
        required_model="transformer",
    ),
)
