"""FedAPA's bounded downlink: own set + k sampled peers, an unbiased estimate of Eq. 10."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch
from inprocess import Federation

from mqttfl.algorithms.base import ClientInfo, Context, Upload
from mqttfl.algorithms.fedapa import FedAPAParams, FedAPAServer, peer_sample, prototype_contrast
from mqttfl.wire.control import encode_downlinks


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


def test_peer_sample_is_own_set_then_k_distinct_peers_with_weights_summing_to_one() -> None:
    sets, weights = peer_sample(10, 3, seed=0, t=4, row=7)
    assert sets[0] == 7 and 7 not in sets[1:] and len(set(sets.tolist())) == 4
    np.testing.assert_allclose(weights, [1 / 10, 9 / 30, 9 / 30, 9 / 30])
    assert weights.sum() == pytest.approx(1.0)
    again, _ = peer_sample(10, 3, seed=0, t=4, row=7)
    assert again.tolist() == sets.tolist()  # seeded: a re-sent downlink is the same


def test_the_sampled_contrast_is_an_unbiased_estimate_of_eq_10() -> None:
    """E over every k-subset of peers of the weighted L_c equals Eq. 10's mean over all N."""
    n, k, c, d = 5, 2, 4, 6
    gen = torch.Generator().manual_seed(0)
    sets = torch.randn(n, c, d, generator=gen)
    z = torch.randn(7, d, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    available = torch.tensor([True, True, True, False])
    exact = prototype_contrast(z, sets, y, available, 0.5)
    row = 2
    others = [j for j in range(n) if j != row]
    weights = torch.tensor([1 / n] + [(n - 1) / (k * n)] * k)
    estimates = [
        prototype_contrast(z, sets[[row, *peers]], y, available, 0.5, weights)
        for peers in combinations(others, k)
    ]
    assert torch.stack(estimates).mean().item() == pytest.approx(exact.item(), rel=1e-5)
    # with every set and uniform weights it is Eq. 10 itself
    uniform = torch.full((n,), 1 / n)
    assert prototype_contrast(z, sets, y, available, 0.5, uniform).item() == pytest.approx(
        exact.item(), rel=1e-6
    )


def test_above_k_plus_one_every_personal_downlink_stays_under_the_bound() -> None:
    c, d, k = 21, 256, 9
    for n in (12, 40):
        down = _server(c, d, k).aggregate(1, _uploads(n, c, d))
        assert "prototypes" not in down.broadcast
        payloads = encode_downlinks("r", 1, down.broadcast, down.personal)
        bound = (k + 2) * c * d * 4 + 2048  # k+1 sets and Q_i, float32, plus framing
        assert max(len(p) for p in payloads.personal.values()) <= bound <= 250_000
        body = down.personal["3"]
        assert body["peers"].shape == (k + 1, c, d) and body["peer_weights"].shape == (k + 1,)


def test_a_federation_above_the_bound_trains_on_sampled_sets() -> None:
    fed = Federation("fedapa", clients=5, rounds=2, max_peer_sets=2).run()
    client = fed.clients[0]
    assert client.p is not None and client.p.shape[0] == 3  # own set + 2 peers
    assert client.p_weights is not None and float(client.p_weights.sum()) == pytest.approx(1.0)
