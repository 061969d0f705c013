"""FedAPA-S (mqttfl/algorithms/fedapa_session.py): AdaBN statistics, k-means from Q_i, and
the protocol (no L_c: the downlink is Q_i alone)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from mqttfl.adaptation.refine import refine_prototypes
from mqttfl.algorithms.fedapa.session import renormalize
from mqttfl.training.loops import embed_all, predict_logits
from mqttfl.wire.downlinks import read_downlink
from tests.inprocess import NUM_CLASSES, Federation


class _Norm(nn.Module):
    """The smallest EmbeddingModel-like module: embed() is one BatchNorm1d."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(2)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


def _stats(model: nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(running mean, running variance, γ) of the model's one BatchNorm1d."""
    norm = next(m for m in model.modules() if isinstance(m, nn.BatchNorm1d))
    assert norm.running_mean is not None
    assert norm.running_var is not None
    return norm.running_mean.numpy(), norm.running_var.numpy(), norm.weight.detach().numpy()


def _unit(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


def test_renormalize_takes_the_statistics_of_the_new_windows_and_keeps_the_weights() -> None:
    model = _Norm()
    with torch.no_grad():
        model.norm.weight.copy_(torch.tensor([2.0, 3.0]))
        model.norm.running_mean.fill_(10.0)  # type: ignore[union-attr]
    x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    adapted = renormalize(model, x, batch_size=2)  # type: ignore[arg-type]
    # by hand: mean (2, 4); unbiased variance ((1-2)²+(3-2)²)/1 = 2, ((2-4)²+(6-4)²)/1 = 8
    mean, var, gamma = _stats(adapted)
    np.testing.assert_allclose(mean, [2.0, 4.0])
    np.testing.assert_allclose(var, [2.0, 8.0])
    np.testing.assert_allclose(gamma, [2.0, 3.0])
    assert not adapted.training
    np.testing.assert_allclose(_stats(model)[0], [10.0, 10.0])  # a copy


def test_renormalize_takes_the_moments_of_all_windows_however_they_are_batched() -> None:
    x = np.array([[0.0, 0.0], [2.0, 2.0], [10.0, 10.0], [14.0, 14.0]], np.float32)
    # by hand: mean 6.5; deviations -6.5, -4.5, 3.5, 7.5 -> squares 131, unbiased /3
    for batch in (1, 2, 3, 4):
        mean, var, _ = _stats(renormalize(_Norm(), x, batch_size=batch))  # type: ignore[arg-type]
        np.testing.assert_allclose(mean, [6.5, 6.5])
        np.testing.assert_allclose(var, [131 / 3, 131 / 3], rtol=1e-6)


def test_one_k_means_step_moves_a_window_to_the_class_whose_prototype_came_closer() -> None:
    # anchors at 0° and 60°; windows at 20°, 25°, 35°, 80°, 85°. The nearest anchor puts
    # 35° in class 1 (25° from 60°, 35° from 0°). One step: class 0 -> mean of 20°, 25° =
    # 22.5°; class 1 -> the direction of the sum of 35°, 80°, 85°: atan2(2.5546, 1.0800) =
    # 67.08°; 35° is then 12.5° from class 0 and 32.1° from class 1, so it changes class.
    # A second step: class 0 -> atan2(1.3382, 2.6652) = 26.665°; nothing changes class.
    z = np.array([_unit(a) for a in (20, 25, 35, 80, 85)], np.float32) * 3.0
    anchors = np.array([_unit(0), _unit(60)], np.float32)
    available = np.array([True, True])
    labels, _ = refine_prototypes(z, anchors.copy(), available, 0)
    assert labels.tolist() == [0, 0, 1, 1, 1]
    labels, protos = refine_prototypes(z, anchors.copy(), available, 1)
    assert labels.tolist() == [0, 0, 0, 1, 1]
    assert math.degrees(math.atan2(protos[0, 1], protos[0, 0])) == pytest.approx(22.5, abs=1e-4)
    assert math.degrees(math.atan2(protos[1, 1], protos[1, 0])) == pytest.approx(67.08, abs=0.01)
    labels, protos = refine_prototypes(z, anchors.copy(), available, 2)
    assert labels.tolist() == [0, 0, 0, 1, 1]
    assert math.degrees(math.atan2(protos[0, 1], protos[0, 0])) == pytest.approx(26.665, abs=0.01)


def test_k_means_never_assigns_an_unavailable_class_and_keeps_an_empty_ones_prototype() -> None:
    z = np.array([_unit(10), _unit(80)], np.float32)
    anchors = np.array([_unit(0), _unit(90), _unit(45)], np.float32)
    labels, protos = refine_prototypes(z, anchors.copy(), np.array([True, False, True]), 3)
    assert 1 not in labels.tolist()
    labels, protos = refine_prototypes(z, anchors.copy(), np.array([True, True, True]), 1)
    assert labels.tolist() == [0, 1]
    np.testing.assert_allclose(protos[2], _unit(45), atol=1e-6)  # no window: kept


def test_a_federation_sends_q_alone_and_predicts_every_test_window() -> None:
    fed = Federation("fedapa-session", clients=3, rounds=3).run()
    assert fed.summary is not None
    close = fed.closed[-1]
    broadcast = read_downlink(close.payloads.broadcast, run_id="r", round=close.round, client="all")
    assert set(broadcast.body) == {"available"}  # no L_c: no peer sets
    assert set(close.payloads.personal) == {"0", "1", "2"}  # Q_i, one each
    for client in fed.clients:
        assert client.p is None  # type: ignore[attr-defined]
        assert client.q is not None  # type: ignore[attr-defined]
        predicted = client.predict(client.shard.x_test)
        assert predicted.shape == client.shard.y_test.shape
        assert set(predicted.tolist()) <= set(range(NUM_CLASSES))


def test_adapted_statistics_make_the_model_blind_to_a_session_gain() -> None:
    """Conv (no bias) then BatchNorm: with statistics of the windows at hand, a session
    recorded at 4x the gain gives the logits of the original session; the trained
    statistics do not."""
    fed = Federation("fedapa-session", clients=2, rounds=2).run()
    client = fed.clients[0]
    x = client.shard.x_test
    loud = (x * 4.0).astype(np.float32)
    adapted = predict_logits(renormalize(client.model, x), x)
    adapted_loud = predict_logits(renormalize(client.model, loud), loud)
    np.testing.assert_allclose(adapted_loud, adapted, atol=1e-3)
    trained = predict_logits(client.model, x)
    assert not np.allclose(predict_logits(client.model, loud), trained, atol=1e-1)


@pytest.mark.parametrize("gate", [True, False])
def test_a_prediction_is_its_definition_step_by_step(gate: bool) -> None:
    """predict reuses the gate's forward passes; its labels and the trained head it
    reports are those of the definition run pass by pass: the trained head where the
    gate keeps the trained statistics, else the k-means from Q_i on the embeddings
    adapted to the windows."""
    fed = Federation("fedapa-session", clients=2, rounds=2, gate=gate).run()
    decided = set()
    for client in fed.clients:
        x, y = client.shard.x_test, client.shard.y_test
        decision = client.decide(x)  # type: ignore[attr-defined]
        decided.add(decision.adapted)
        if decision.adapted:
            adapted = renormalize(client.model, x)
            z = embed_all(adapted, x)
            available = client.available.numpy().astype(bool)  # type: ignore[attr-defined]
            expected, _ = refine_prototypes(z, client.q.numpy().copy(), available, 5)  # type: ignore[attr-defined]
        else:
            expected = predict_logits(client.model, x).argmax(axis=1)
        np.testing.assert_array_equal(client.predict(x), expected)
        head = predict_logits(client.model, x).argmax(axis=1)
        reported = client.extra_metrics(x, y)["head_accuracy"]
        assert reported == pytest.approx(float(np.mean(head == y)))
    if not gate:
        assert decided == {True}
