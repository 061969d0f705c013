"""FedSAP equations on hand-computed cases (../shared/seeds/001_288956de9ced9de5.txt)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from mqttfl.algorithms.base import Context
from mqttfl.algorithms.common.prototypes import prototype_distance, prototype_squared_distance
from mqttfl.algorithms.fedsap import (
    FedSAPClient,
    FedSAPParams,
    FedSAPServer,
    Schedule,
    calibrate_thresholds,
    consistency_loss,
    curriculum_lambda,
    mixed_prototypes,
    proxy_loss,
    pseudo_labels,
    strong_view,
    weak_view,
)
from tests.bodies import array
from tests.inprocess import Federation


# --- Eq. 7 with the appendix's start round: 0 up to round 20, 0.7 at round 100 ------------
@pytest.mark.parametrize(
    ("t", "expected"),
    [(1, 0.0), (20, 0.0), (21, 0.7 / 80), (60, 0.35), (80, 0.7 * 60 / 80), (100, 0.7), (120, 0.7)],
)
def test_linear_curriculum(t: int, expected: float) -> None:
    assert curriculum_lambda(t, lambda_max=0.7, start_round=20, end_round=100) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(
    ("shape", "t", "expected"),
    [
        ("cosine", 40, 0.7 * (1 - math.cos(math.pi / 4)) / 2),  # u = 1/4
        ("cosine", 60, 0.35),
        ("sigmoid", 60, 0.35),  # symmetric about the midpoint
        ("sigmoid", 20, 0.0),
        ("sigmoid", 100, 0.7),
        ("step", 20, 0.0),
        ("step", 21, 0.7),
        ("constant", 1, 0.7),  # no curriculum (Table 4's ablation)
    ],
)
def test_curriculum_shapes(shape: Schedule, t: int, expected: float) -> None:
    value = curriculum_lambda(t, lambda_max=0.7, start_round=20, end_round=100, shape=shape)
    assert value == pytest.approx(expected, abs=1e-12)


@given(
    st.sampled_from(["linear", "cosine", "sigmoid", "step"]),
    st.integers(0, 50),
    st.integers(1, 120),
)
def test_every_ramp_is_nondecreasing_and_within_bounds(
    shape: Schedule, start: int, end: int
) -> None:
    values = [
        curriculum_lambda(t, lambda_max=0.7, start_round=start, end_round=end, shape=shape)
        for t in range(0, 130)
    ]
    assert values == sorted(values)
    assert values[0] == 0.0
    assert max(values) == pytest.approx(0.7)


def test_server_schedules_lambda_up_to_the_last_round_and_the_semi_phase() -> None:
    server = FedSAPServer(
        Context(
            num_classes=3,
            embed_dim=2,
            rounds=100,
            seed=0,
            params=FedSAPParams(semi_supervised=True, supervised_rounds=60),
        )
    )
    assert server.start_round == 20  # 0.2 of 100 rounds: the appendix's round 20
    assert server.round_params(20) == {"lambda": 0.0, "semi": False}
    assert server.round_params(60)["lambda"] == pytest.approx(0.35)
    assert server.round_params(61)["semi"] is True
    assert server.round_params(100)["lambda"] == pytest.approx(0.7)


# --- Eqs. 8-9: the proxy loss ----------------------------------------------------------
def test_proxy_loss_is_a_scaled_cosine_softmax() -> None:
    # ĥ = [0.6, 0.8]; cos to p̂_0 = 0.6, to p̂_1 = 0.8; logits 19.2, 25.6 at s = 32
    # -log softmax_0 = log(1 + e^{6.4})
    bank = torch.tensor([[2.0, 0.0], [0.0, 5.0]])  # only directions matter
    loss = proxy_loss(
        torch.tensor([[3.0, 4.0]]), bank, torch.tensor([0]), torch.tensor([True, True]), 32.0
    )
    assert float(loss) == pytest.approx(math.log1p(math.exp(6.4)), rel=1e-6)
    loss = proxy_loss(
        torch.tensor([[3.0, 4.0]]), bank, torch.tensor([1]), torch.tensor([True, True]), 32.0
    )
    assert float(loss) == pytest.approx(math.log1p(math.exp(-6.4)), abs=1e-7)


def test_proxy_loss_leaves_out_unavailable_classes_and_their_samples() -> None:
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    z = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    loss = proxy_loss(z, bank, torch.tensor([0, 2]), torch.tensor([True, True, False]), 32.0)
    assert float(loss) == pytest.approx(math.log1p(math.exp(6.4)), rel=1e-6)


@pytest.mark.parametrize(("form", "proto_term"), [("squared", 8 * 0.25), ("mse", 0.25)])
def test_supervised_loss_is_eq_3(form: str, proto_term: float) -> None:
    # z = 0.5·1 against p̄_0 = 1 in d = 8: ‖z - p̄_0‖² = 8·0.25 = 2 (Eq. 5 as written);
    # torch's MSE divides that by d: 0.25
    fed = Federation("fedsap", clients=1, rounds=1, proxy_scale=8.0, proto_distance=form)
    client = fed.clients[0]
    assert isinstance(client, FedSAPClient)
    client.bank = torch.tensor([[1.0] * 8, [0.0] * 8, [2.0] * 8, [-1.0] * 8])
    client.available = torch.tensor([True, True, True, True])
    logits, z, y = torch.tensor([[1.0, 0.5, 0.0, 0.0]]), torch.ones(1, 8) * 0.5, torch.tensor([0])
    expected = (
        float(F.cross_entropy(logits, y))
        + 0.3 * proto_term
        + float(proxy_loss(z, client.bank, y, client.available, 8.0))
    )
    assert float(client.loss(1, {"lambda": 0.3}, logits, z, y)) == pytest.approx(expected, rel=1e-6)


def test_eq_5_squared_distance_by_hand() -> None:
    # sample 0 (class 0): ‖[1,2] - [0,0]‖² = 5; sample 1 (class 1): ‖[4,4] - [5,5]‖² = 2;
    # sample 2's class is not in the bank and is left out: (5 + 2) / 2 = 3.5
    z = torch.tensor([[1.0, 2.0], [4.0, 4.0], [9.0, 9.0]])
    bank = torch.tensor([[0.0, 0.0], [5.0, 5.0], [1.0, 1.0]])
    y, available = torch.tensor([0, 1, 2]), torch.tensor([True, True, False])
    assert float(prototype_squared_distance(z, bank, y, available)) == pytest.approx(3.5)
    assert float(prototype_distance(z, bank, y, available, "mse")) == pytest.approx(3.5 / 2)
    assert float(prototype_distance(z, bank, y, available, "squared")) == pytest.approx(3.5)
    nobody = torch.tensor([False, False, False])
    assert float(prototype_squared_distance(z, bank, y, nobody)) == 0.0


def test_eq_5_default_is_torchs_mse_as_in_fedprotos_code() -> None:
    assert FedSAPParams().proto_distance == "mse"


# --- Sec. 3.6: pseudo-labels, thresholds, consistency, mixed prototypes --------------------
BANK = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])


def test_pseudo_labels_eq_10_and_acceptance_eq_11() -> None:
    # cosine distances: [1, .1] -> (0.004963, 0.900496, 1.995037): label 0, margin 0.895533
    #                   [1, 1]  -> (0.292893, 0.292893, 1.707107): margin 0, rejected
    #                   [0, 1]  -> (1, 0, 1): label 1, margin 1
    #                   [-1,-1] -> (1.707107, 1.707107, 0.292893): label 2, margin 1.414214
    weak = torch.tensor([[1.0, 0.1], [1.0, 1.0], [0.0, 1.0], [-1.0, -1.0]])
    labels, accept = pseudo_labels(
        weak, BANK, torch.tensor([True, True, True]), margin=0.5, max_distance=0.5
    )
    assert labels[accept].tolist() == [0, 1, 2]
    assert accept.tolist() == [True, False, True, True]
    _, accept = pseudo_labels(
        weak, BANK, torch.tensor([True, True, True]), margin=0.9, max_distance=0.5
    )
    assert accept.tolist() == [False, False, True, True]  # 0.8955 is not above M = 0.9
    _, accept = pseudo_labels(
        weak, BANK, torch.tensor([True, True, True]), margin=0.5, max_distance=0.004
    )
    assert accept.tolist() == [False, False, True, False]  # only distance 0 is below D_max
    # without class 2 the last sample is 1.707 from both others: margin 0, rejected
    _, accept = pseudo_labels(
        weak, BANK, torch.tensor([True, True, False]), margin=0.5, max_distance=2.0
    )
    assert accept.tolist() == [True, False, True, False]


def test_thresholds_are_calibrated_from_labelled_margins_and_true_distances() -> None:
    # z = [1,0] (class 0): true d 0, margin 1; z = [1,.5] (class 0): true d 0.105573, margin
    # 0.552786 - 0.105573 = 0.447214; z = [0,1] (class 1): true d 0, margin 1.
    z = torch.tensor([[1.0, 0.0], [1.0, 0.5], [0.0, 1.0]])
    margin, d_max = calibrate_thresholds(
        z, torch.tensor([0, 0, 1]), BANK[:2], torch.tensor([True, True]), 0.9
    )
    # D_max: 0.9-quantile of (0, 0, 0.105573) = 0.8·0.105573; M: 0.1-quantile of (0.447214, 1, 1)
    assert d_max == pytest.approx(0.8 * (1 - 1 / math.sqrt(1.25)), rel=1e-5)
    assert margin == pytest.approx(0.447214 + 0.2 * (1 - 0.447214), rel=1e-5)


def test_consistency_loss_eq_12_is_the_mean_cosine_distance() -> None:
    strong = torch.tensor([[3.0, 4.0], [0.0, -2.0]])
    loss = consistency_loss(strong, BANK, torch.tensor([1, 0]))
    assert float(loss) == pytest.approx(((1 - 0.8) + (1 - 0.0)) / 2)


def test_mixed_prototypes_eq_14() -> None:
    labelled = np.array([[2.0, 0.0], [0.0, 1.0]])
    strong = np.array([[4.0, 0.0], [0.0, 3.0]])
    classes, protos, counts = mixed_prototypes(
        labelled, np.array([0, 0]), strong, np.array([0, 1]), alpha=0.5
    )
    # class 0: ([2,0] + [0,1] + 0.5·[4,0]) / (2 + 0.5) = [1.6, 0.4] -> / 1.649242
    assert classes.tolist() == [0, 1]
    assert counts.tolist() == [3, 1]
    np.testing.assert_allclose(protos[0], [1.6 / math.sqrt(2.72), 0.4 / math.sqrt(2.72)], rtol=1e-6)
    np.testing.assert_allclose(protos[1], [0.0, 1.0])  # only a pseudo-labelled sample: norm([0,3])


def test_views_keep_shape_and_strong_is_further_from_the_input() -> None:
    x = np.random.default_rng(0).normal(size=(50, 16, 6)).astype(np.float32)
    weak, strong = weak_view(x, np.random.default_rng(1)), strong_view(x, np.random.default_rng(1))
    assert weak.shape == strong.shape == x.shape
    assert weak.dtype == np.float32
    assert np.abs(weak - x).mean() < np.abs(strong - x).mean()


# --- the semi-supervised phase, in process -----------------------------------------------
def test_unlabelled_pool_is_drawn_from_the_clients_own_shard() -> None:
    fed = Federation("fedsap", clients=2, rounds=1, semi_supervised=True, unlabelled_fraction=0.25)
    client = fed.clients[0]
    assert isinstance(client, FedSAPClient)
    assert client.pool is not None
    x, y = client.labelled()
    assert len(client.pool) == 8
    assert len(y) == 24
    rows = {r.tobytes() for r in client.shard.x_train}
    assert {r.tobytes() for r in client.pool} <= rows
    assert not {r.tobytes() for r in client.pool} & {r.tobytes() for r in x}


def test_semi_supervised_rounds_calibrate_once_and_upload_unit_mixed_prototypes() -> None:
    fed = Federation(
        "fedsap",
        clients=2,
        rounds=3,
        semi_supervised=True,
        supervised_rounds=1,
        sap_start_round=0,
        threshold_quantile=0.99,
    ).run()
    client = fed.clients[0]
    assert isinstance(client, FedSAPClient)
    assert client.thresholds is not None
    assert client.semi_round
    body = fed.uploads[0].body
    np.testing.assert_allclose(np.linalg.norm(array(body, "prototypes"), axis=1), 1.0, rtol=1e-5)
    state = client.state_dict()
    fresh = Federation("fedsap", clients=1, rounds=3, semi_supervised=True).clients[0]
    fresh.load_state_dict(state)
    assert isinstance(fresh, FedSAPClient)
    assert fresh.thresholds == pytest.approx(client.thresholds)
