"""Model weights as one flat float32 vector: the payload of parameter-sharing methods."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from mqttfl.algorithms.base import ClientInfo, Context, Upload
from mqttfl.errors import MqttflError
from mqttfl.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from torch import nn
else:
    torch = lazy_import("torch")
    nn = lazy_import("torch.nn")


def _float_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    # Parameters and BatchNorm running statistics; the integer batch counter stays local.
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def flatten_weights(model: nn.Module) -> np.ndarray:
    return torch.cat([v.detach().reshape(-1).float() for _, v in _float_entries(model)]).numpy()


def load_weights(model: nn.Module, flat: np.ndarray) -> None:
    entries = _float_entries(model)
    expected = sum(v.numel() for _, v in entries)
    if flat.shape != (expected,):
        raise MqttflError(f"weight vector has shape {flat.shape}, model needs ({expected},)")
    state = {}
    offset = 0
    for name, value in entries:
        n = value.numel()
        state[name] = torch.from_numpy(flat[offset : offset + n].copy()).reshape(value.shape)
        offset += n
    model.load_state_dict(state, strict=False)


@lru_cache(maxsize=64)
def _length(arch: str, num_classes: int, embed_dim: int, sample_shape: tuple[int, ...]) -> int:
    from mqttfl.models import build_model

    input_dim = int(np.prod(sample_shape)) if len(sample_shape) == 1 else None
    model = build_model(arch, num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)
    return sum(v.numel() for _, v in _float_entries(model))


def weights_length(ctx: Context, info: ClientInfo) -> int:
    """Length of the flat weight vector of the client's announced architecture."""
    return _length(info.arch, ctx.num_classes, ctx.embed_dim, info.sample_shape)


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
    return (w @ stacked / w.sum()).astype(np.float32)


def average_by_group(uploads: list[Upload], weights: dict[str, float]) -> dict[str, np.ndarray]:
    """Weighted FedAvg of ``body['weights']`` within each architecture group."""
    groups: dict[str, list[Upload]] = {}
    for upload in uploads:
        groups.setdefault(group_key(upload.info), []).append(upload)
    return {
        key: weighted_average(
            [u.body["weights"] for u in members], [weights[u.client_id] for u in members]
        )
        for key, members in groups.items()
    }
