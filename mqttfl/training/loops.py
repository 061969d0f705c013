"""Plain local training and evaluation loops, shared by every algorithm's client side."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from mqttfl.training.lazy import nn, no_grad, torch
from mqttfl.training.memory import eval_batch_size
from mqttfl.training.optimizers import SGD, Adam, Optimizer, Stepper

if TYPE_CHECKING:
    from torch import Tensor

if TYPE_CHECKING:
    from mqttfl.config import TrainConfig
    from mqttfl.models.base import EmbeddingModel

# loss(logits, embedding, labels) -> scalar tensor
LossFn = Callable[["Tensor", "Tensor", "Tensor"], "Tensor"]


def batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator | None
) -> Iterator[tuple[Tensor, Tensor]]:
    order = rng.permutation(len(x)) if rng is not None else np.arange(len(x))
    for start in range(0, len(x), batch_size):
        index = order[start : start + batch_size]
        yield torch.from_numpy(x[index]), torch.from_numpy(y[index])


def make_optimizer(model: nn.Module, train: TrainConfig) -> Optimizer:
    if train.optimizer == "adam":
        return Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    return SGD(
        model.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
    )


def train_epochs(
    model: nn.Module,
    optimizer: Stepper,
    x: np.ndarray,
    y: np.ndarray,
    loss_fn: LossFn,
    *,
    epochs: int,
    batch_size: int,
    rng: np.random.Generator,
    max_grad_norm: float | None = None,
) -> float:
    """Run SGD epochs; return the mean loss of the last epoch. ``max_grad_norm`` clips
    each step's gradient to that global ℓ2 norm (``torch.nn.utils.clip_grad_norm_``)."""
    model.train()
    mean = 0.0
    for _ in range(epochs):
        total, count = 0.0, 0
        for xb, yb in batches(x, y, batch_size, rng):
            if len(yb) < 2 and count:  # a lone sample breaks BatchNorm statistics
                continue
            logits, embedding = model(xb)
            loss = loss_fn(logits, embedding, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if max_grad_norm is not None:
                params = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total += float(loss.detach()) * len(yb)
            count += len(yb)
        mean = total / max(count, 1)
    optimizer.zero_grad(set_to_none=True)  # nothing reads them: a waiting client holds none
    return mean


@no_grad
def embed_all(model: EmbeddingModel, x: np.ndarray, batch_size: int | None = None) -> np.ndarray:
    """Embeddings r(h) of every sample, in eval mode (Eq. 4 averages these), in batches
    of ``batch_size`` (default: :func:`~mqttfl.training.memory.eval_batch_size`)."""
    model.eval()
    batch_size = batch_size or eval_batch_size(model, x.shape[1:])
    parts = [model.embed(xb) for xb, _ in batches(x, np.zeros(len(x)), batch_size, None)]
    return torch.cat(parts).numpy() if parts else np.zeros((0, model.embed_dim), np.float32)


@no_grad
def predict_logits(model: nn.Module, x: np.ndarray, batch_size: int | None = None) -> np.ndarray:
    """Class scores of every sample, in eval mode, in batches of ``batch_size`` (default:
    :func:`~mqttfl.training.memory.eval_batch_size`, which bounds the activations)."""
    model.eval()
    batch_size = batch_size or eval_batch_size(model, x.shape[1:])
    parts = [model(xb)[0] for xb, _ in batches(x, np.zeros(len(x)), batch_size, None)]
    return torch.cat(parts).numpy()


def class_prototypes(
    embeddings: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eq. 4 of FedAPA: p_i^c = mean of r(h) over the local samples of class c.

    Returns (classes present, prototypes (k, d) float32, counts (k,) int64).
    """
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    sums = np.zeros((len(classes), embeddings.shape[1]), dtype=np.float64)
    np.add.at(sums, inverse, embeddings)
    protos = (sums / counts[:, None]).astype(np.float32)
    return classes.astype(np.int64), protos, counts.astype(np.int64)
