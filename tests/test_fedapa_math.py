"""FedAPA equations on hand-computed cases (../shared/seeds/000_a5a72d69d197eb5b.txt)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mqttfl.algorithms.base import ClientInfo, Context, Upload
from mqttfl.algorithms.fedapa import (
    FedAPAParams,
    FedAPAServer,
    aggregate_prototypes,
    prototype_contrast,
    similarity_weights,
    warmup_lambda,
)
from mqttfl.training.loops import class_prototypes

# Two clients, two classes, d=2, τ=0.5.
#   client 0: p^0 = [1, 0], p^1 = [0, 1]
#   client 1: p^0 = [1, 1], class 1 absent
# Eq. 5: s_01^0 = cos([1,0],[1,1]) = 1/√2 = 0.707107, s_00^0 = s_11^0 = 1.
# Eq. 6: α_00^0 = e^{2} / (e^{2} + e^{1.414214}) = 7.389056 / 11.502306 = 0.642398,
#        α_01^0 = 0.357602; symmetric for client 1: α_10^0 = 0.357602, α_11^0 = 0.642398.
# Eq. 7: q_0^0 = 0.642398·[1,0] + 0.357602·[1,1] = [1, 0.357602]
#        q_1^0 = 0.357602·[1,0] + 0.642398·[1,1] = [1, 0.642398]
#        q_0^1 = [0, 1] (client 0 is the only holder).
# Eq. 8: client 1 lacks class 1, so p_1^1 = q_1^1 = mean over holders = [0, 1].
P = np.array([[[1, 0], [0, 1]], [[1, 1], [0, 0]]], dtype=np.float32)
MASK = np.array([[True, True], [True, False]])


def test_similarity_weights_eqs_5_6() -> None:
    alpha = similarity_weights(P, MASK, tau=0.5)
    np.testing.assert_allclose(alpha[0], [[0.642398, 0.357602], [0.357602, 0.642398]], atol=1e-6)
    # class 1: only client 0 is eligible; client 1 has no eligible peers at all
    np.testing.assert_allclose(alpha[1], [[1.0, 0.0], [0.0, 0.0]], atol=1e-7)


def test_personalized_prototypes_and_padding_eqs_7_8() -> None:
    q, padded, available = aggregate_prototypes(P, MASK, tau=0.5)
    np.testing.assert_allclose(q[0], [[1, 0.357602], [0, 1]], atol=1e-6)
    np.testing.assert_allclose(q[1], [[1, 0.642398], [0, 1]], atol=1e-6)
    np.testing.assert_allclose(padded[1, 1], [0, 1])  # P_1 padded too
    np.testing.assert_allclose(padded[0], P[0])  # own prototypes untouched
    assert available.tolist() == [True, True]


def test_padding_is_the_plain_mean_of_holders_and_absent_classes_stay_unavailable() -> None:
    protos = np.zeros((3, 3, 2), np.float32)
    mask = np.zeros((3, 3), bool)
    protos[0, 0], protos[1, 0] = [2, 0], [0, 4]
    mask[0, 0] = mask[1, 0] = True
    protos[2, 1] = [1, 1]
    mask[2, 1] = True
    q, padded, available = aggregate_prototypes(protos, mask, tau=0.5)
    np.testing.assert_allclose(q[2, 0], [1, 2])  # (1/2)([2,0] + [0,4])
    np.testing.assert_allclose(padded[2, 0], [1, 2])
    np.testing.assert_allclose(q[0, 1], [1, 1])
    assert available.tolist() == [True, True, False]
    np.testing.assert_allclose(q[:, 2], 0)


def test_a_more_similar_peer_gets_more_weight() -> None:
    protos = np.array([[[1, 0]], [[0.9, 0.1]], [[0, 1]]], np.float32)
    alpha = similarity_weights(protos, np.ones((3, 1), bool), tau=0.5)
    assert alpha[0, 0, 1] > alpha[0, 0, 2]
    np.testing.assert_allclose(alpha.sum(axis=2), 1.0, atol=1e-6)


def test_mean_aggregation_ablation_gives_one_global_set() -> None:
    q, _, _ = aggregate_prototypes(P, MASK, tau=0.5, similarity=False)
    np.testing.assert_allclose(q[0, 0], [1, 0.5])
    np.testing.assert_allclose(q[1, 0], [1, 0.5])


@pytest.mark.parametrize(
    ("t", "expected"),
    [(0, 0.0), (10, 0.5 * (1 - math.cos(math.pi / 5))), (25, 0.5), (50, 1.0), (80, 1.0)],
)
def test_cosine_warmup_eq_11(t: int, expected: float) -> None:
    assert warmup_lambda(t, lambda_min=0.0, lambda_max=1.0, warmup_rounds=50) == pytest.approx(
        expected
    )


def test_warmup_is_nondecreasing_and_respects_bounds() -> None:
    values = [warmup_lambda(t, lambda_min=0.2, lambda_max=0.8, warmup_rounds=7) for t in range(12)]
    assert values == sorted(values)
    assert values[0] == pytest.approx(0.2)
    assert values[-1] == pytest.approx(0.8)


def test_global_contrast_eq_9() -> None:
    # cos(z, q^0) = 1, cos(z, q^1) = 0 → logits [2, 0]; -log(e^2/(e^2+1)) = log(1 + e^-2)
    z = torch.tensor([[1.0, 0.0]])
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss = prototype_contrast(z, q, torch.tensor([0]), torch.tensor([True, True]), tau=0.5)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)


def test_client_contrast_eq_10_averages_over_prototype_sets() -> None:
    z = torch.tensor([[2.0, 0.0]])  # only the direction matters (cosine)
    sets = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]])
    loss = prototype_contrast(z, sets, torch.tensor([0]), torch.tensor([True, True]), tau=0.5)
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-math.sqrt(2)))) / 2
    assert float(loss) == pytest.approx(expected, abs=1e-6)


def test_unavailable_classes_leave_the_softmax() -> None:
    z = torch.tensor([[1.0, 0.0]])
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    loss = prototype_contrast(z, q, torch.tensor([0]), torch.tensor([True, True, False]), tau=0.5)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)


def test_prototypes_eq_4_are_class_means() -> None:
    emb = np.array([[1, 0], [3, 0], [0, 2]], np.float32)
    classes, protos, counts = class_prototypes(emb, np.array([1, 1, 4]))
    assert classes.tolist() == [1, 4]
    np.testing.assert_allclose(protos, [[2, 0], [0, 2]])
    assert counts.tolist() == [2, 1]


def test_server_sends_each_client_its_own_q_and_everyone_the_padded_set() -> None:
    ctx = Context(num_classes=2, embed_dim=2, rounds=3, seed=0, params=FedAPAParams())
    info = ClientInfo("0", "tiny", (0, 1), 10, (4, 4))
    uploads = [
        Upload(
            "0", info, {"classes": np.array([0, 1]), "prototypes": P[0], "counts": np.array([3, 4])}
        ),
        Upload(
            "1", info, {"classes": np.array([0]), "prototypes": P[1, :1], "counts": np.array([5])}
        ),
    ]
    down = FedAPAServer(ctx).aggregate(1, uploads)
    np.testing.assert_allclose(down.personal["1"]["q"], [[1, 0.642398], [0, 1]], atol=1e-6)
    assert down.broadcast["prototypes"].shape == (2, 2, 2)
    assert "weights" not in down.broadcast
    assert FedAPAServer(ctx).round_params(25)["lambda"] == pytest.approx(
        warmup_lambda(25, lambda_min=0, lambda_max=1, warmup_rounds=50)
    )
