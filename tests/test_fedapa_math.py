"""FedAPA equations on hand-computed cases (../shared/seeds/000_a5a72d69d197eb5b.txt)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.fedapa import (
    FedAPAClient,
    FedAPAParams,
    FedAPAServer,
    aggregate_prototypes,
    personalized_prototypes,
    prototype_contrast,
    similarity_weights,
    warmup_lambda,
    warmup_length,
)
from mqttfl.config import TrainConfig
from mqttfl.data.shard import Shard
from mqttfl.models import build_model
from mqttfl.training.loops import class_prototypes
from mqttfl.wire.schemas import ClientInfo
from tests.bodies import array

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
    np.testing.assert_allclose(q[0], [[1.0, 0.357602], [0.0, 1.0]], atol=1e-6)
    np.testing.assert_allclose(q[1], [[1.0, 0.642398], [0.0, 1.0]], atol=1e-6)
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


UPLOADS = [
    Upload(
        "0",
        ClientInfo("0", "tiny", (0, 1), 10, (4, 4)),
        {"classes": np.array([0, 1]), "prototypes": P[0]},
    ),
    Upload(
        "1",
        ClientInfo("1", "tiny", (0,), 10, (4, 4)),
        {"classes": np.array([0]), "prototypes": P[1, :1]},
    ),
]


def test_server_sends_each_client_its_own_q_and_everyone_the_padded_set() -> None:
    ctx = Context(num_classes=2, embed_dim=2, rounds=100, seed=0, params=FedAPAParams())
    down = FedAPAServer(ctx).aggregate(1, UPLOADS)
    np.testing.assert_allclose(
        array(down.personal["1"], "q"), [[1.0, 0.642398], [0.0, 1.0]], atol=1e-6
    )
    assert array(down.broadcast, "prototypes").shape == (2, 2, 2)
    assert "weights" not in down.broadcast
    assert FedAPAServer(ctx).round_params(25)["lambda"] == pytest.approx(
        warmup_lambda(25, lambda_min=0, lambda_max=1, warmup_rounds=50)
    )


# --- the schedule covers the run: T_warm is the paper's 50, capped at half the run --------
@pytest.mark.parametrize(("rounds", "expected"), [(1, 1), (3, 1), (20, 10), (60, 30), (100, 50)])
def test_default_warmup_is_the_papers_50_capped_at_half_the_run(rounds: int, expected: int) -> None:
    assert warmup_length(rounds, None) == expected
    assert warmup_length(rounds, 7) == 7  # an explicit T_warm is kept


@pytest.mark.parametrize("rounds", range(2, 121))
def test_lambda_reaches_lambda_max_in_every_run_with_the_default_warmup(rounds: int) -> None:
    ctx = Context(num_classes=2, embed_dim=2, rounds=rounds, seed=0, params=FedAPAParams())
    server = FedAPAServer(ctx)
    assert server.round_params(rounds)["lambda"] == pytest.approx(1.0)
    assert server.round_params(rounds // 2 + 1)["lambda"] == pytest.approx(1.0)


# --- the upload is prototypes only -----------------------------------------------------------
def _client(params: FedAPAParams | None = None, *, num_classes: int = 2) -> FedAPAClient:
    rng = np.random.default_rng(0)
    y = np.arange(12) % num_classes
    x = rng.normal(size=(12, 8, 6)).astype(np.float32)
    ctx = Context(
        num_classes=num_classes, embed_dim=2, rounds=4, seed=0, params=params or FedAPAParams()
    )
    info = ClientInfo("0", "tiny", tuple(range(num_classes)), 8, (8, 6))
    torch.manual_seed(0)
    model = build_model("tiny", num_classes=num_classes, embed_dim=2)
    shard = Shard(x[:8], y[:8], x[8:], y[8:], {"source": "toy"})
    return FedAPAClient(ctx, info, model, shard, TrainConfig(batch_size=4))


@pytest.mark.parametrize("name", ["fedapa", "fedapa-global-avg", "fedapa-global-avg-client-protos"])
def test_the_upload_carries_no_label_histogram(name: str) -> None:
    algorithm = get_algorithm(name)
    ctx = Context(num_classes=2, embed_dim=2, rounds=4, seed=0, params=algorithm.params())
    schema = algorithm.upload_schema(ctx, ClientInfo("0", "tiny", (0, 1), 8, (8, 6)))
    assert set(schema.fields) == {"classes", "prototypes"}
    body = _client().make_upload(1)
    assert set(body) == {"classes", "prototypes"}
    schema.validate(body)


# --- Eq. 12: the client's loss ----------------------------------------------------------
# z = [1, 0] of class 0, logits [0, 0] (CE = log 2), τ = 0.5.
# L_g with Q_i = {[1,0], [0,1]}: cosines 1, 0 → logits 2, 0 → log(1 + e^-2) = 0.126928.
# L_c with P = {([1,0],[0,1]), ([1,1],[0,1])}: set 1 as L_g; set 2 cosines 1/√2, 0 →
#   log(1 + e^-√2) = 0.217622; mean 0.172275.
# λ = 0.5: L = 0.693147 + 0.5·(0.126928 + 0.172275) = 0.842749.
Z, LOGITS, Y = torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([0])
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
P_SETS = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]])
L_G = math.log1p(math.exp(-2))
L_C = (math.log1p(math.exp(-2)) + math.log1p(math.exp(-math.sqrt(2)))) / 2


def test_client_loss_eq_12_by_hand() -> None:
    client = _client()
    client.q, client.p, client.available = Q, P_SETS, torch.tensor([True, True])
    loss = client.loss(3, {"lambda": 0.5}, LOGITS, Z, Y)
    assert float(loss) == pytest.approx(math.log(2) + 0.5 * (L_G + L_C), abs=1e-6)
    assert float(loss) == pytest.approx(0.842749, abs=1e-6)


def test_client_loss_is_cross_entropy_until_lambda_and_prototypes_exist() -> None:
    client = _client()
    assert float(client.loss(3, {"lambda": 0.5}, LOGITS, Z, Y)) == pytest.approx(math.log(2))
    client.q, client.p, client.available = Q, P_SETS, torch.tensor([True, True])
    assert float(client.loss(3, {"lambda": 0.0}, LOGITS, Z, Y)) == pytest.approx(math.log(2))
    assert float(client.loss(3, {}, LOGITS, Z, Y)) == pytest.approx(math.log(2))
    client.p = None  # the global-avg ablation: no client sets, no L_c
    loss = client.loss(3, {"lambda": 0.5}, LOGITS, Z, Y)
    assert float(loss) == pytest.approx(math.log(2) + 0.5 * L_G, abs=1e-6)


def test_client_loss_leaves_unavailable_classes_out_of_both_terms() -> None:
    # a third class nobody holds, its anchor on top of z: it must not enter either softmax
    client = _client(num_classes=3)
    client.q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    client.p = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]] * 2)
    client.p[1, 0] = torch.tensor([1.0, 1.0])
    client.available = torch.tensor([True, True, False])
    logits = torch.zeros(1, 3)
    loss = client.loss(3, {"lambda": 0.5}, logits, Z, Y)
    assert float(loss) == pytest.approx(math.log(3) + 0.5 * (L_G + L_C), abs=1e-6)


# --- receive: what comes down is what the next round trains with -------------------------
def test_receive_takes_the_personal_q_the_padded_p_and_the_available_classes() -> None:
    ctx = Context(num_classes=2, embed_dim=2, rounds=4, seed=0, params=FedAPAParams())
    down = FedAPAServer(ctx).aggregate(1, UPLOADS)
    client = _client()
    client.receive(1, down.broadcast, down.personal["1"])
    assert client.q is not None
    assert client.p is not None
    assert client.available is not None
    torch.testing.assert_close(
        client.q, torch.tensor([[1.0, 0.642398], [0.0, 1.0]]), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        client.p, torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]])
    )
    assert client.available.tolist() == [True, True]
    # The next round's loss uses exactly these (z = [1, 0] of class 0, λ = 1, τ = 0.5):
    # L_g: cos(z, q^0) = 1/‖(1, 0.642398)‖ = 0.841354, cos(z, q^1) = 0
    #      → log(1 + e^{-1.682708}) = 0.170477; L_c = 0.172275 (P is P_SETS)
    # L = 0.693147 + 0.170477 + 0.172275 = 1.035899
    loss = client.loss(2, {"lambda": 1.0}, LOGITS, Z, Y)
    assert float(loss) == pytest.approx(1.035899, abs=1e-5)


def test_receive_prefers_the_broadcast_global_set_and_ignores_empty_downlinks() -> None:
    client = _client(FedAPAParams(aggregation="mean", use_client_prototypes=False))
    client.receive(1, {}, None)  # no aggregate yet (e.g. nobody uploaded)
    assert client.q is None
    assert client.p is None
    assert client.available is None
    global_set = np.array([[1.0, 0.5], [0.0, 1.0]], np.float32)
    client.receive(1, {"available": np.array([1, 0], np.uint8), "global": global_set}, None)
    assert client.q is not None
    assert client.available is not None
    np.testing.assert_allclose(client.q.numpy(), global_set)
    assert client.p is None
    assert client.available.tolist() == [True, False]


# --- Eq. 7: the fast path against the materialized α of Eqs. 5-6 ---------------------------
# Three clients, one class, τ = 0.5, p_0 = [1,0], p_1 = [1,1], p_2 = [0,1].
# Row 0: cosines 1, 1/√2, 0 → α_0 = softmax(2, √2, 0) = (0.591015, 0.328999, 0.079985)
# Row 1: cosines 1/√2, 1, 1/√2 → α_1 = softmax(√2, 2, √2) = (0.263407, 0.473186, 0.263407)
# α is not symmetric (α_01 = 0.329 but α_10 = 0.263); q_0 = (0.920015, 0.408985),
# q_1 = (0.736593, 0.736593).
ASYM = np.array([[[1.0, 0.0]], [[1.0, 1.0]], [[0.0, 1.0]]], np.float32)


def test_eq_7_by_hand_on_an_asymmetric_case() -> None:
    alpha = similarity_weights(ASYM, np.ones((3, 1), bool), tau=0.5)[0]
    np.testing.assert_allclose(alpha[0], [0.591015, 0.328999, 0.079985], atol=1e-6)
    np.testing.assert_allclose(alpha[1], [0.263407, 0.473186, 0.263407], atol=1e-6)
    assert alpha[0, 1] != pytest.approx(alpha[1, 0])
    q = personalized_prototypes(ASYM, np.ones((3, 1), bool), tau=0.5)
    np.testing.assert_allclose(q[0, 0], [0.920015, 0.408985], atol=1e-6)
    np.testing.assert_allclose(q[1, 0], [0.736593, 0.736593], atol=1e-6)


def _materialized(protos: np.ndarray, mask: np.ndarray, tau: float) -> np.ndarray:
    alpha = similarity_weights(protos, mask, tau)  # (C, N, N)
    full: np.ndarray = np.einsum("cij,jcd->icd", alpha, protos.astype(np.float64))
    return full


def test_eq_7_fast_path_matches_similarity_weights_with_missing_classes_and_norms() -> None:
    # four clients, three classes, different norms and signs; client 2 lacks class 0,
    # client 3 holds class 2 alone, class 1 is held by clients 0, 1, 3
    protos = np.array(
        [
            [[3.0, 0.0, 1.0], [0.0, -2.0, 0.5], [0.0, 0.0, 0.0]],
            [[1.0, 1.0, 0.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]],
            [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]],
            [[-1.0, 0.2, 0.0], [0.1, 4.0, -1.0], [1.0, -2.0, 0.0]],
        ],
        np.float32,
    )
    mask = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 1], [1, 1, 1]], bool)
    fast = personalized_prototypes(protos, mask, tau=0.3)
    slow = _materialized(protos, mask, tau=0.3)
    np.testing.assert_allclose(fast[mask], slow[mask], rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(np.float32, (4, 3, 5), elements=st.floats(-5, 5, width=32)),
    hnp.arrays(bool, (4, 3)),
    st.sampled_from([0.1, 0.5, 2.0]),
)
def test_eq_7_fast_path_matches_similarity_weights_everywhere(
    protos: np.ndarray, mask: np.ndarray, tau: float
) -> None:
    assume(float(np.linalg.norm(protos, axis=2).min()) > 0.1)  # a direction to compare
    fast = personalized_prototypes(protos, mask, tau)
    slow = _materialized(protos, mask, tau)
    np.testing.assert_allclose(fast[mask], slow[mask], rtol=1e-4, atol=1e-4)
