"""Bounded evaluation batches: every pass over a shard but training is batched
so that its activations stay under a budget, and the answers do not change."""

from __future__ import annotations

import numpy as np
import torch

from mqttfl.models import EmbeddingModel, build_model
from mqttfl.training.loops import embed_all, predict_logits, train_epochs
from mqttfl.training.memory import (
    EVAL_ACTIVATION_BYTES,
    MAX_EVAL_BATCH,
    eval_batch_size,
    largest_activation,
    release,
    resident_mb,
)
from mqttfl.training.optimizers import SGD


def _model(arch: str) -> EmbeddingModel:
    torch.manual_seed(0)
    return build_model(arch, num_classes=21, embed_dim=256, input_dim=None)


def test_the_largest_activation_is_the_first_block_of_a_convnet4() -> None:
    # 64x242 through a 3x3 stride-2 convolution with padding 1: 32x121 per channel
    assert largest_activation(_model("middle"), (64, 242)) == 16 * 32 * 121
    assert largest_activation(_model("tiny"), (64, 242)) == 256 * 32 * 121
    assert largest_activation(_model("large"), (50, 51)) == 16 * 25 * 26


def test_the_eval_batch_keeps_two_largest_activations_under_the_budget() -> None:
    per_sample = 2 * 4 * 16 * 32 * 121  # float32, a layer's input and output
    assert eval_batch_size(_model("middle"), (64, 242)) == EVAL_ACTIVATION_BYTES // per_sample
    assert eval_batch_size(_model("tiny"), (64, 242)) == EVAL_ACTIVATION_BYTES // (16 * per_sample)
    assert eval_batch_size(_model("middle"), (8, 8)) == MAX_EVAL_BATCH  # small windows: capped


def test_measuring_does_not_touch_the_model() -> None:
    model = _model("middle")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eval_batch_size(model, (64, 242))
    assert model.training
    for key, value in model.state_dict().items():  # BatchNorm statistics included
        assert torch.equal(value, before[key]), key


def test_bounded_batches_give_the_answers_one_big_batch_gives() -> None:
    model = _model("tiny")
    x = np.random.default_rng(0).normal(size=(9, 64, 242)).astype(np.float32)
    assert eval_batch_size(model, x.shape[1:]) < len(x)
    bounded = predict_logits(model, x)
    whole = predict_logits(model, x, batch_size=len(x))
    np.testing.assert_allclose(bounded, whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(embed_all(model, x), embed_all(model, x, batch_size=len(x)), 1e-5)


def test_release_and_resident_figures() -> None:
    release()
    rss, peak = resident_mb()
    assert 0 < rss <= peak


def test_training_leaves_no_gradients_held() -> None:
    """A client waits most of a round: its gradients (a model's worth) are freed when its
    training ends, and the next training step makes them again."""
    model = _model("tiny")
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 64, 242)).astype(np.float32)
    y = rng.integers(0, 21, size=8)

    def loss_fn(
        logits: torch.Tensor, embedding: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, labels)

    before = [p.detach().clone() for p in model.parameters()]
    train_epochs(model, optimizer, x, y, loss_fn, epochs=1, batch_size=4, rng=rng)
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert optimizer.state  # the momentum stays: it is the method's state, not a temporary
