"""Model weights as one flat float32 vector: the payload of parameter-sharing methods."""

from __future__ import annotations

from typing import TypedDict, cast

import numpy as np

from mqttfl.algorithms.base import Context, Downlinks, ServerSide, Upload
from mqttfl.errors import ModelError
from mqttfl.models.sizes import weight_count
from mqttfl.training.lazy import nn, torch
from mqttfl.wire.schemas import ClientInfo


class WeightsUpload(TypedDict):
    """The upload of a method that shares its model: one flat float32 vector of its
    weights (:func:`flatten_weights`) and the samples it trained on."""

    weights: np.ndarray
    num_samples: int


def uploaded_weights(upload: Upload) -> WeightsUpload:
    """``upload``'s body, which its schema checked, as the weights upload it is."""
    return cast("WeightsUpload", upload.body)


def float_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The state-dict entries that travel as weights, in order: parameters and BatchNorm
    running statistics (the integer batch counter stays local)."""
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def flatten_weights(model: nn.Module) -> np.ndarray:
    return torch.cat([v.detach().reshape(-1).float() for _, v in float_entries(model)]).numpy()


def load_weights(model: nn.Module, flat: np.ndarray) -> None:
    entries = float_entries(model)
    expected = sum(v.numel() for _, v in entries)
    if flat.shape != (expected,):
        raise ModelError(f"weight vector has shape {flat.shape}, model needs ({expected},)")
    state = {}
    offset = 0
    for name, value in entries:
        n = value.numel()
        state[name] = torch.from_numpy(flat[offset : offset + n].copy()).reshape(value.shape)
        offset += n
    model.load_state_dict(state, strict=False)


def weights_length(ctx: Context, info: ClientInfo) -> int:
    """Length of the flat weight vector of the client's announced architecture, counted
    from its shapes (:mod:`mqttfl.models.sizes`: the coordinator never builds a model)."""
    input_dim = int(np.prod(info.sample_shape)) if len(info.sample_shape) == 1 else None
    return weight_count(
        info.arch, num_classes=ctx.num_classes, embed_dim=ctx.embed_dim, input_dim=input_dim
    )


def group_key(info: ClientInfo) -> str:
    """Clients average only with identical architectures (and input widths for MLPs)."""
    if len(info.sample_shape) == 1:
        return f"{info.arch}-{info.sample_shape[0]}"
    return info.arch


def weighted_average(vectors: list[np.ndarray], weights: list[float] | np.ndarray) -> np.ndarray:
    """Σ_k w_k θ_k / Σ_k w_k; the weights are required (no silent plain mean)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(vectors),) or w.sum() <= 0:
        raise ValueError("weighted_average needs one positive weight per vector")
    stacked = np.stack(vectors).astype(np.float64)
    return cast("np.ndarray", (w @ stacked / w.sum()).astype(np.float32))


def average_by_group(uploads: list[Upload], weights: dict[str, float]) -> dict[str, np.ndarray]:
    """Weighted FedAvg of ``body['weights']`` within each architecture group."""
    groups: dict[str, list[Upload]] = {}
    for upload in uploads:
        groups.setdefault(group_key(upload.info), []).append(upload)
    return {
        key: weighted_average(
            [uploaded_weights(u)["weights"] for u in members],
            [weights[u.client_id] for u in members],
        )
        for key, members in groups.items()
    }


class ModelVersions(ServerSide):
    """Buffered mode (:mod:`mqttfl.engine.buffered`) for methods that upload a model
    (``weights``) and broadcast one per group of identical architectures (:func:`group_key`).

    Each version's broadcast weights are kept; an upload of round u trained from version
    u-1, so its delta is Δ_k = θ_k - θ^(u-1), and the method aggregates θ'_k = θ^(t-1) +
    s(τ_k)·Δ_k with its own sample weights: θ^(t) = θ^(t-1) + Σ_k n_k s(τ_k) Δ_k / Σ_k n_k
    (FedBuff Algorithm 1 with η_g = 1 and sample weights; a stale delta shrinks the step
    instead of being renormalized away). Round 1's uploads have no published base (every
    client starts from its own seeded initial model): at version 1 they are averaged as
    they are; one that arrives later moves the model toward it by s(τ), θ^(t-1) +
    s(τ)(θ_k - θ^(t-1)) (FedAsync's mixing, Xie et al. 2019, Eq. 1, with α·s = s).
    """

    def version(self, downlinks: Downlinks) -> dict[str, np.ndarray]:
        groups = downlinks.broadcast.get("weights")
        if not isinstance(groups, dict):
            return {}
        return {str(k): np.asarray(v) for k, v in groups.items()}

    def rebase(
        self,
        upload: Upload,
        s: float,
        base: dict[str, np.ndarray],
        now: dict[str, np.ndarray],
    ) -> Upload:
        """θ^(t-1) + s·(θ_k - θ^(u-1)) for an upload of round u, trained from ``base``."""
        if "weights" not in upload.body:
            return upload
        key = group_key(upload.info)
        theta = uploaded_weights(upload)["weights"]
        if key not in now or now[key].shape != theta.shape:
            return upload  # version 1 (nothing published yet): averaged as it is
        if key in base and base[key].shape == theta.shape:
            moved = now[key] + np.float32(s) * (theta - base[key])
        else:  # its base (version 0) was never published: FedAsync's mixing, θ toward θ_k
            moved = now[key] + np.float32(s) * (theta - now[key])
        return Upload(upload.client_id, upload.info, {**upload.body, "weights": moved})
