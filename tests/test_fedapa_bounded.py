"""FedAPA's bounded downlink: one shared sample of k+1 sets plus each client's own, an
unbiased estimate of Eq. 10."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.fedapa import (
    FedAPAClient,
    FedAPAParams,
    FedAPAServer,
    prototype_contrast,
    sample_weights,
    shared_sample,
)
from mqttfl.wire.control import encode_downlinks
from mqttfl.wire.schemas import ClientInfo
from tests.inprocess import Federation


def _uploads(n: int, c: int, d: int) -> list[Upload]:
    rng = np.random.default_rng(n)
    uploads = []
    for i in range(n):
        classes = np.sort(rng.choice(c, size=max(1, c - 1), replace=False))
        info = ClientInfo(str(i), "tiny", tuple(classes.tolist()), 10, (8, 6))
        protos = rng.standard_normal((len(classes), d)).astype(np.float32)
        uploads.append(Upload(str(i), info, {"classes": classes, "prototypes": protos}))
    return uploads


def _server(c: int, d: int, k: int) -> FedAPAServer:
    return FedAPAServer(Context(c, d, 10, 0, FedAPAParams(max_peer_sets=k)))


def test_up_to_k_plus_one_clients_get_every_set_once_exactly_as_the_paper() -> None:
    bounded = _server(4, 8, k=5).aggregate(1, _uploads(6, 4, 8))
    unbounded = _server(4, 8, k=1000).aggregate(1, _uploads(6, 4, 8))
    assert bounded.broadcast["prototypes"].shape == (6, 4, 8)
    np.testing.assert_array_equal(
        bounded.broadcast["prototypes"], unbounded.broadcast["prototypes"]
    )
    assert all(set(body) == {"q"} for body in bounded.personal.values())


def test_the_shared_sample_is_seeded_and_the_weights_sum_to_one() -> None:
    sample = shared_sample(10, 4, seed=0, t=4)
    assert len(set(sample.tolist())) == 4
    assert sample.tolist() == sorted(sample.tolist())
    assert shared_sample(10, 4, seed=0, t=4).tolist() == sample.tolist()  # a re-send agrees
    outside = next(r for r in range(10) if r not in sample)
    np.testing.assert_allclose(sample_weights(10, sample, outside), [1 / 10] + [9 / 40] * 4)
    inside = int(sample[1])
    weights = sample_weights(10, sample, inside)
    np.testing.assert_allclose(weights, [1 / 10, 9 / 30, 0, 9 / 30, 9 / 30])  # itself: 0
    assert weights.sum() == pytest.approx(1.0)


def test_the_sampled_contrast_is_an_unbiased_estimate_of_eq_10() -> None:
    """E over every shared sample S (|S| = m of all N, containing i or not) of client i's
    weighted L_c over [P_i, *S] equals Eq. 10's mean over all N sets."""
    n, m, c, d = 5, 3, 4, 6
    gen = torch.Generator().manual_seed(0)
    sets = torch.randn(n, c, d, generator=gen)
    z = torch.randn(7, d, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    available = torch.tensor([True, True, True, False])
    exact = prototype_contrast(z, sets, y, available, 0.5)
    for row in (0, 2):
        estimates = []
        for members in combinations(range(n), m):
            sample = np.array(members)
            weights = torch.from_numpy(sample_weights(n, sample, row))
            anchors = torch.cat([sets[row : row + 1], sets[list(members)]])
            estimates.append(prototype_contrast(z, anchors, y, available, 0.5, weights))
        assert torch.stack(estimates).mean().item() == pytest.approx(exact.item(), rel=1e-5)
    # with every set and uniform weights it is Eq. 10 itself
    uniform = torch.full((n,), 1 / n)
    assert prototype_contrast(z, sets, y, available, 0.5, uniform).item() == pytest.approx(
        exact.item(), rel=1e-6
    )


def test_above_k_plus_one_every_downlink_stays_under_the_bound() -> None:
    c, d, k = 21, 256, 8
    for n in (12, 40):
        down = _server(c, d, k).aggregate(1, _uploads(n, c, d))
        assert down.broadcast["prototypes"].shape == (k + 1, c, d)
        payloads = encode_downlinks("r", 1, down.broadcast, down.personal)
        bound = (k + 3) * c * d * 4 + 2048  # S, P_i and Q_i, float32, plus framing
        biggest = len(payloads.broadcast) + max(len(p) for p in payloads.personal.values())
        assert biggest <= bound <= 250_000
        body = down.personal["3"]
        assert body["own"].shape == (c, d)
        assert body["set_weights"].shape == (k + 2,)


def test_a_federation_above_the_bound_trains_on_sampled_sets() -> None:
    fed = Federation("fedapa", clients=5, rounds=2, max_peer_sets=2).run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    assert client.p is not None
    assert client.p.shape[0] == 4
    assert client.p_weights is not None
    assert float(client.p_weights.sum()) == pytest.approx(1.0)


def test_sample_weights_that_do_not_fit_the_broadcast_sample_drop_l_c_for_the_round() -> None:
    fed = Federation("fedapa", clients=5, rounds=1, max_peer_sets=2).run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    c, d = client.ctx.num_classes, client.ctx.embed_dim
    broadcast = {
        "available": np.ones(c, np.uint8),
        "prototypes": np.zeros((3, c, d), np.float32),
    }
    personal = {
        "q": np.zeros((c, d), np.float32),
        "own": np.zeros((c, d), np.float32),
        "set_weights": np.full(2, 0.5, np.float32),  # S has 3 sets: 4 weights expected
    }
    client.check_downlink(broadcast, None)
    client.check_downlink({}, personal)
    client.receive(2, broadcast, personal)
    assert client.p is None
    assert client.p_weights is None
    assert client.q is not None
