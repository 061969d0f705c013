"""FedAli's ALP layer and server on hand-computed cases (../shared/seeds/002_cad0a0bc49eb696e.txt)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch

from mqttfl.algorithms import fedali
from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.common.weights import flatten_weights, load_weights, weights_length
from mqttfl.algorithms.fedali import (
    FedAliClient,
    FedAliParams,
    FedAliServer,
    global_prototypes,
    weighted_mean_prototypes,
)
from mqttfl.errors import ConfigError
from mqttfl.models import build_model
from mqttfl.models.transformer import ALPLayer, TransformerEncoderNet, ema_update, sinkhorn
from mqttfl.training import optimizers
from mqttfl.training.loops import predict_logits, train_epochs
from mqttfl.wire.schemas import ClientInfo
from tests.bodies import array, mapping
from tests.inprocess import Federation


# --- Eq. 3: Sinkhorn-Knopp ---------------------------------------------------------------
def test_sinkhorn_by_hand() -> None:
    # exp(scores/ε) with ε = 1 is [[3, 1], [1, 1]]. Normalizing to total 1, then rows
    # (prototypes) to 1/2 and columns (embeddings) to 1/2, once, and scaling by N = 2:
    # [[0.6, 0.4], [1/3, 2/3]]; three rounds give [[45/71, 26/71], [15/41, 26/41]].
    scores = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]], dtype=torch.float64)
    once = sinkhorn(scores, epsilon=1.0, iterations=1)
    torch.testing.assert_close(
        once, torch.tensor([[0.6, 0.4], [1 / 3, 2 / 3]], dtype=torch.float64)
    )
    thrice = sinkhorn(scores, epsilon=1.0, iterations=3)
    torch.testing.assert_close(
        thrice, torch.tensor([[45 / 71, 26 / 71], [15 / 41, 26 / 41]], dtype=torch.float64)
    )


def test_sinkhorn_marginals_after_three_iterations() -> None:
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(48, 16), dim=1)
    p = torch.nn.functional.normalize(torch.randn(8, 16), dim=1)
    plan = sinkhorn(x @ p.T, epsilon=0.05, iterations=3)
    # every embedding is fully assigned (the last step normalizes embeddings exactly) ...
    torch.testing.assert_close(plan.sum(dim=1), torch.ones(48), atol=1e-5, rtol=0)

    # ... while the prototypes' loads only approach the uniform N/K = 6: each iteration
    # narrows their spread (here 1.40 -> 0.84 -> 0.52 of N/K), well inside a plain
    # row-wise softmax's 0.87 after three
    def spread(plan: torch.Tensor) -> float:
        return float((plan.sum(dim=0) / 6.0 - 1).abs().max())

    spreads = [spread(sinkhorn(x @ p.T, epsilon=0.05, iterations=i)) for i in (1, 2, 3)]
    assert spreads == sorted(spreads, reverse=True)
    assert spreads[2] < 0.6
    assert spread(torch.softmax(x @ p.T / 0.05, dim=1)) > spreads[2]
    converged = sinkhorn(x @ p.T, epsilon=0.05, iterations=200).sum(dim=0) / 6.0
    torch.testing.assert_close(converged, torch.ones(8), atol=1e-3, rtol=0)


# --- Eq. 5: the EMA update of the local prototypes ---------------------------------------
def test_ema_update_from_top_k_weighted_embeddings() -> None:
    # N = 4 embeddings, G = 2 prototypes: k = ⌈4/2⌉ = 2.
    # prototype 0's top two scores are 0.9 (x0) and 0.6 (x1): x̄0 = 0.6·[2,0] + 0.4·[4,0] = [2.8, 0]
    # prototype 1's are 0.8 (x2) and 0.7 (x3): x̄1 = (8/15)·[0,2] + (7/15)·[0,6] = [0, 58/15]
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    x = torch.tensor([[2.0, 0.0], [4.0, 0.0], [0.0, 2.0], [0.0, 6.0]])
    plan = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.3, 0.7]])
    out = ema_update(prototypes, x, plan, gamma=0.9)
    assert out is prototypes  # in place
    torch.testing.assert_close(
        prototypes, torch.tensor([[0.9 + 0.28, 0.0], [0.0, 0.9 + 0.1 * 58 / 15]])
    )


def test_ema_update_with_one_embedding_per_prototype_is_a_plain_ema_step() -> None:
    prototypes = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    x = torch.tensor([[10.0, 0.0], [0.0, 10.0]])
    ema_update(prototypes, x, torch.tensor([[0.2, 0.7], [0.8, 0.3]]), gamma=0.999)  # k = 1
    torch.testing.assert_close(prototypes, torch.tensor([[0.0, 0.01], [1.009, 0.999]]))


# --- Algorithm 1 / Eq. 4 in the layer -------------------------------------------------------
def _layer(local: list[list[float]], shared: list[list[float]]) -> ALPLayer:
    layer = ALPLayer(2)
    with torch.no_grad():  # GLU(p) = p ⊙ σ(0) = p/2
        layer.glu.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
        layer.glu.bias.zero_()
    layer.attach(
        torch.tensor(local), torch.tensor(shared), beta=0.2, gamma=0.5, epsilon=0.05, iterations=3
    )
    return layer


def test_alp_inference_aligns_with_the_local_prototype_only() -> None:
    # one token x = [1, 0], one local prototype [0, 2]: GLU gives [0, 1] and
    # x̂ = 0.2·[0,1] + 0.8·[1,0] = [0.8, 0.2], normalized: [0.970143, 0.242536]
    layer = _layer([[0.0, 2.0]], [[100.0, -100.0]]).eval()
    out = layer(torch.tensor([[[1.0, 0.0]]]))
    torch.testing.assert_close(out, torch.tensor([[[0.8, 0.2]]]) / math.sqrt(0.68))
    torch.testing.assert_close(layer.local, torch.tensor([[0.0, 2.0]]))  # no update at inference


def test_alp_training_aligns_with_global_and_updates_only_local_prototypes() -> None:
    layer = _layer([[0.0, 2.0]], [[0.0, -4.0]]).train()
    x = torch.tensor([[[1.0, 0.0]]], requires_grad=True)
    out = layer(x)
    # matched global [0,-4] -> GLU [0,-2]: x̂ = 0.2·[0,-2] + 0.8·[1,0] = [0.8, -0.4]
    torch.testing.assert_close(out, torch.tensor([[[0.8, -0.4]]]) / math.sqrt(0.8))
    torch.testing.assert_close(layer.local, torch.tensor([[0.5, 1.0]]))  # 0.5·[0,2] + 0.5·[1,0]
    torch.testing.assert_close(layer.shared, torch.tensor([[0.0, -4.0]]))
    out.sum().backward()
    assert x.grad is not None
    assert layer.glu.weight.grad is not None
    assert not layer.local.requires_grad
    assert not layer.shared.requires_grad


def test_alp_is_the_identity_until_prototypes_are_attached() -> None:
    layer = ALPLayer(4)
    x = torch.randn(2, 3, 4)
    assert layer(x) is x


def test_prototypes_are_not_part_of_the_weights() -> None:
    model = build_model("transformer", num_classes=4, embed_dim=8)
    assert isinstance(model, TransformerEncoderNet)
    before = flatten_weights(model)
    for layer in model.alp_layers():
        layer.attach(
            torch.ones(16, layer.dim),
            torch.ones(16, layer.dim),
            beta=0.2,
            gamma=0.9,
            epsilon=0.05,
            iterations=3,
        )
    assert flatten_weights(model).shape == before.shape
    info = ClientInfo("0", "transformer", (0,), 10, (8, 6))
    ctx = Context(num_classes=4, embed_dim=8, rounds=2, seed=0, params=FedAliParams())
    assert weights_length(ctx, info) == before.shape[0]


def test_the_transformer_reads_any_number_of_subcarriers() -> None:
    model = build_model("transformer", num_classes=4, embed_dim=8)
    for s in (3, 30, 242):
        assert model(torch.randn(2, 10, s))[1].shape == (2, 8)
    assert model(torch.randn(2, 500, 7))[0].shape == (2, 4)  # pooled to max_tokens


# --- Algorithm 2: the server ----------------------------------------------------------------
def test_kmeans_starts_from_the_sample_weighted_mean_of_local_prototypes() -> None:
    # client a: prototypes at 0 and 6; client b: at 4 and 10 (one dimension).
    stacked = np.array([[[0.0], [6.0]], [[4.0], [10.0]]])
    np.testing.assert_allclose(weighted_mean_prototypes(stacked, np.array([1, 3])), [[3.0], [9.0]])
    # equal counts start at 2 and 8: {0, 4} and {6, 10} is already a fixed point
    np.testing.assert_allclose(
        global_prototypes(stacked, np.array([1, 1]), iterations=10), [[2.0], [8.0]]
    )
    # counts 7:1 start at 0.5 and 6.5: 4 joins the upper cluster, a different local optimum
    np.testing.assert_allclose(
        global_prototypes(stacked, np.array([7, 1]), iterations=10), [[0.0], [20 / 3]], rtol=1e-6
    )


def test_server_averages_weights_and_sends_global_prototypes_only() -> None:
    fed = Federation("fedali", arch="transformer", rounds=1).run()
    down = fed.server.aggregate(2, fed.uploads)
    assert set(down.broadcast) == {"weights", "global"}
    assert down.personal == {}
    assert set(mapping(down.broadcast, "global")) == {"0", "1"}
    assert array(down.broadcast, "global", "0").shape == (64, 32)
    for upload in fed.uploads:
        assert set(upload.body) == {"weights", "num_samples", "local_0", "local_1"}
    # the clients now hold the server's global prototypes and kept their own local ones
    client = fed.clients[0]
    assert isinstance(client, FedAliClient)
    np.testing.assert_allclose(
        client.layers[0].local.numpy(), array(fed.uploads[0].body, "local_0")
    )


def test_clients_start_from_the_same_prototypes_and_local_ones_drift_apart() -> None:
    fed = Federation("fedali", arch="transformer", rounds=1)
    a, b = fed.clients[0], fed.clients[1]
    assert isinstance(a, FedAliClient)
    assert isinstance(b, FedAliClient)
    torch.testing.assert_close(a.layers[0].local, b.layers[0].shared)
    fed.run()
    assert not torch.allclose(a.layers[0].local, b.layers[0].local)
    state = a.state_dict()
    assert set(state) == {"local_0", "local_1", "global_0", "global_1", "next_weights"}
    fresh = Federation("fedali", arch="transformer", rounds=1).clients[0]
    assert isinstance(fresh, FedAliClient)
    fresh.load_state_dict(state)  # a restarted client still starts its next round from w_r
    assert fresh.next_weights is not None
    np.testing.assert_array_equal(fresh.next_weights, state["next_weights"])


# --- the scoring point and local recipe of the official code ------------------------------
def test_a_client_is_scored_on_the_model_it_trained_not_on_the_download(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runtime evaluates right after ``receive``; the official code evaluates right
    after ``fit``. Loading the averaged weights in ``receive`` would fail this test."""
    fed = Federation("fedali", arch="transformer", rounds=1)
    client = fed.clients[0]
    assert isinstance(client, FedAliClient)
    fed.round(1)  # train, upload, aggregate, receive, predict: the runtime's order
    trained = fed.uploads[0].body["weights"]
    averaged = array(fed.server.aggregate(1, fed.uploads).broadcast, "weights", "transformer")
    assert np.abs(trained - averaged).max() > 1e-5  # the two models do differ
    np.testing.assert_array_equal(flatten_weights(client.model), trained)
    x = client.shard.x_test
    scored = client.predict(x)
    np.testing.assert_array_equal(scored, predict_logits(client.model, x).argmax(axis=1))
    downloaded = copy.deepcopy(client.model)
    load_weights(downloaded, averaged)
    assert not np.array_equal(predict_logits(downloaded, x), predict_logits(client.model, x))

    # ... and the next local training starts from the averaged weights (Algorithm 2, l. 6)
    started_from: list[np.ndarray] = []
    real_train = train_epochs

    def spy(model: torch.nn.Module, *args: Any, **kwargs: Any) -> float:
        started_from.append(flatten_weights(model))
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(fedali, "train_epochs", spy)
    client.train(2, {}, np.random.default_rng(2))
    np.testing.assert_allclose(started_from[0], averaged, rtol=0, atol=0)
    assert client.next_weights is None


def test_local_training_is_the_papers_adam_five_epochs_batch_64(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed = Federation("fedali", arch="transformer", rounds=1)
    client = fed.clients[0]
    assert isinstance(client, FedAliClient)
    optimizer = client.local_optimizer()
    assert isinstance(optimizer, optimizers.Adam)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert client.local_optimizer() is not optimizer  # a fresh one every round
    seen: dict[str, object] = {}

    def record(*args: object, epochs: int, batch_size: int, **kwargs: object) -> float:
        seen.update(epochs=epochs, batch_size=batch_size, optimizer=args[1])
        return 0.0

    monkeypatch.setattr(fedali, "train_epochs", record)
    client.train(1, {}, np.random.default_rng(0))
    assert seen["epochs"] == 5
    assert seen["batch_size"] == 64
    assert isinstance(seen["optimizer"], optimizers.Adam)
    sgd = Federation("fedali", arch="transformer", rounds=1, local_optimizer="train").clients[0]
    sgd.train(1, {}, np.random.default_rng(0))
    assert seen["optimizer"] is sgd.optimizer  # the run's [train] SGD, its epochs and batch
    assert seen["epochs"] == sgd.train_config.local_epochs
    assert seen["batch_size"] == sgd.train_config.batch_size


def test_fedali_refuses_models_without_alp_layers_and_wrong_counts() -> None:
    with pytest.raises(ConfigError, match="ALP"):
        Federation("fedali", arch="middle")
    with pytest.raises(ConfigError, match="prototype_counts"):
        Federation("fedali", arch="transformer", prototype_counts=(8, 4, 2))


def test_aggregate_is_weighted_by_samples() -> None:
    ctx = Context(
        num_classes=4, embed_dim=8, rounds=2, seed=0, params=FedAliParams(prototype_counts=(2, 2))
    )
    n = weights_length(ctx, ClientInfo("0", "transformer", (0,), 1, (8, 6)))

    def up(cid: str, value: float, samples: int) -> Upload:
        info = ClientInfo(cid, "transformer", (0,), samples, (8, 6))
        local = (
            np.array([[value, 0.0], [0.0, value]], np.float32) @ np.ones((2, 32), np.float32) / 2
        )
        return Upload(
            cid,
            info,
            {
                "weights": np.full(n, value, np.float32),
                "num_samples": samples,
                "local_0": local,
                "local_1": local,
            },
        )

    down = FedAliServer(ctx).aggregate(1, [up("0", 1.0, 1), up("1", 5.0, 3)])
    np.testing.assert_allclose(array(down.broadcast, "weights", "transformer"), 4.0)  # (1 + 15) / 4
