"""FedPAM's adjusted head and PCL on hand-computed cases (../shared/seeds/003_6adbca91b43b4ead.txt)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mqttfl.algorithms.common.weights import flatten_weights
from mqttfl.algorithms.fedpam import FedPAMClient, adjusted_head, personalized_contrastive_loss
from mqttfl.training.loops import train_epochs
from tests.bodies import array
from tests.inprocess import Federation


def test_adjusted_head_eq_3_1() -> None:
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # swaps the feature axes
    torch.testing.assert_close(adjusted_head(w, p), torch.tensor([[2.0, 1.0], [4.0, 3.0]]))


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_pcl_eq_3_3_with_in_batch_negatives(tau: float) -> None:
    # z_0 = e_0 (label 0), z_1 = e_1 (label 1), anchors e_0, e_1. For sample 0:
    # positive s = 1; other anchor s = 0; the in-batch negative z_1 (other label) s = 0:
    # -log(e^{1/τ} / (e^{1/τ} + e^0 + e^0)) = log(1 + 2e^{-1/τ}); sample 1 is symmetric.
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0]])  # normalized inside
    loss = personalized_contrastive_loss(z, torch.tensor([0, 1]), torch.eye(2), tau)
    assert float(loss) == pytest.approx(math.log(1 + 2 * math.exp(-1 / tau)), rel=1e-6)


def test_pcl_ignores_in_batch_samples_of_the_same_label() -> None:
    # both samples are label 0: no in-batch negatives, only the two anchors
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    loss = personalized_contrastive_loss(z, torch.tensor([0, 0]), torch.eye(2), 1.0)
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(0.8 - 0.6))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_pam_starts_at_identity_and_stays_local() -> None:
    fed = Federation("fedpam", clients=2, rounds=1)
    client = fed.clients[0]
    assert isinstance(client, FedPAMClient)
    torch.testing.assert_close(client.pam.detach(), torch.eye(8))
    fed.run()
    trained = client.pam.detach().clone()
    assert not torch.allclose(trained, torch.eye(8))  # trained with θ and W ...
    body = fed.uploads[0].body
    assert set(body) == {"weights", "num_samples"}  # ... but never uploaded
    assert array(body, "weights").shape == flatten_weights(client.model).shape
    torch.testing.assert_close(client.pam.detach(), trained)  # the downlink left it alone
    fresh = Federation("fedpam", clients=1, rounds=1).clients[0]
    fresh.load_state_dict(client.state_dict())
    assert isinstance(fresh, FedPAMClient)
    torch.testing.assert_close(fresh.pam.detach(), trained)


def test_loss_eq_3_4_is_ce_on_the_unadjusted_head_plus_lambda_pcl() -> None:
    client = Federation("fedpam", clients=1, rounds=1, pam_lambda=30.0, pcl_tau=0.5).clients[0]
    assert isinstance(client, FedPAMClient)
    z = torch.randn(4, 8)
    y = torch.tensor([0, 1, 2, 1])
    logits = client.model.classify(z)
    anchors = client.model.classifier.weight @ client.pam
    expected = F.cross_entropy(logits, y) + 30.0 * personalized_contrastive_loss(z, y, anchors, 0.5)
    torch.testing.assert_close(client.loss(1, {}, logits, z, y), expected)


def test_inference_uses_the_adjusted_head() -> None:
    client = Federation("fedpam", clients=1, rounds=1).clients[0]
    assert isinstance(client, FedPAMClient)
    x = client.shard.x_test
    with torch.no_grad():
        client.pam.copy_(torch.flip(torch.eye(8), dims=[0]))  # reverses the features
        client.model.eval()
        z = client.model.embed(torch.from_numpy(x))
        expected = (
            z.flip(dims=[1]) @ client.model.classifier.weight.T + client.model.classifier.bias
        ).argmax(1)
    np.testing.assert_array_equal(client.predict(x), expected.numpy())


def test_pam_lr_sets_the_step_of_every_fedpam_parameter_group() -> None:
    default = Federation("fedpam", clients=1, rounds=1).clients[0]
    steps = {g["lr"] for g in default.optimizer.param_groups}
    assert len(steps) == 1
    assert 0.003 not in steps
    client = Federation("fedpam", clients=1, rounds=1, pam_lr=0.003).clients[0]
    assert [g["lr"] for g in client.optimizer.param_groups] == [0.003, 0.003]


def test_pam_max_grad_norm_clips_every_local_step() -> None:
    assert Federation("fedpam", clients=1, rounds=1).clients[0].max_grad_norm is None
    client = Federation("fedpam", clients=1, rounds=1, pam_max_grad_norm=0.25).clients[0]
    assert client.max_grad_norm == 0.25


@pytest.mark.parametrize("clip", [None, 0.5])
def test_train_epochs_steps_by_the_clipped_gradient(clip: float | None) -> None:
    # One plain SGD step (lr 1, no momentum, no decay) on one batch moves the parameters
    # by exactly the gradient: its full norm unclipped, at most ``clip`` when clipped.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    before = torch.cat([p.detach().flatten().clone() for p in params])
    x = np.array([[10.0, -20.0, 30.0], [5.0, 5.0, -5.0]], np.float32)
    y = np.array([0, 1])

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = model

        def forward(self, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.linear(xb)
            return out, out

    head = Head()

    def loss_fn(logits: torch.Tensor, z: object, yb: object) -> torch.Tensor:
        return (logits**2).sum()  # gradient norm ≫ 0.5

    optimizer = torch.optim.SGD(head.parameters(), lr=1.0)
    logits, _ = head(torch.from_numpy(x))
    grads = torch.autograd.grad(loss_fn(logits, None, None), params)
    full = float(torch.cat([g.flatten() for g in grads]).norm())
    train_epochs(
        head,
        optimizer,
        x,
        y,
        loss_fn,
        epochs=1,
        batch_size=2,
        rng=np.random.default_rng(0),
        max_grad_norm=clip,
    )
    moved = float((torch.cat([p.detach().flatten() for p in params]) - before).norm())
    assert full > 10
    assert moved == pytest.approx(full if clip is None else clip, rel=1e-4)
