"""FedAPA's bounded downlink: one shared sample plus each client's own set, an unbiased
estimate of Eq. 10; stratified (one set per stratum of similar sets, int8) by default,
uniform (k+1 sets, float32) on request."""

from __future__ import annotations

import itertools
from itertools import combinations

import numpy as np
import pytest
import torch

from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.common.prototype_uploads import stack_uploads
from mqttfl.algorithms.fedapa import (
    FedAPAClient,
    FedAPAParams,
    FedAPAServer,
    aggregate_prototypes,
    prototype_contrast,
)
from mqttfl.algorithms.fedapa.peer_sampling import (
    dequantize_sets,
    own_set_sums,
    quantize_sets,
    rebuild_own_set,
    sample_weights,
    set_strata,
    shared_sample,
    strata_weights,
)
from mqttfl.errors import WireError
from mqttfl.wire.downlinks import encode_downlinks
from mqttfl.wire.schemas import ClientInfo
from tests.bodies import array
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


def _server(c: int, d: int, k: int, sampling: str = "uniform") -> FedAPAServer:
    params = FedAPAParams(max_peer_sets=k, sampling=sampling)
    return FedAPAServer(Context(c, d, 10, 0, params))


def test_up_to_k_plus_one_clients_get_every_set_once_exactly_as_the_paper() -> None:
    bounded = _server(4, 8, k=5).aggregate(1, _uploads(6, 4, 8))
    unbounded = _server(4, 8, k=1000).aggregate(1, _uploads(6, 4, 8))
    assert array(bounded.broadcast, "prototypes").shape == (6, 4, 8)
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


def test_stratified_weights_are_unbiased_for_every_client() -> None:
    """Over every draw of representatives and alternates, each peer's expected weight in
    client i's L_c is exactly 1/N, and its own set's is 1/N: Eq. 10's mean."""
    labels = np.array([0, 0, 0, 1, 1, 2, 0, 1])  # strata of 4, 3 and 1 sets
    n = len(labels)
    members = [[int(j) for j in np.flatnonzero(labels == s)] for s in range(3)]
    for row in range(n):
        expected = np.zeros(n)
        draws = list(itertools.product(*members))
        for reps in draws:
            alts_options = [[a for a in members[s] if a != reps[s]] or [-1] for s in range(3)]
            for alts in itertools.product(*alts_options):
                p = 1.0 / len(draws) / np.prod([len(o) for o in alts_options])
                weights, extra = strata_weights(labels, np.array(reps), np.array(alts), row)
                assert weights.sum() == pytest.approx(1.0)
                expected[row] += p * weights[0]
                for s, rep_ in enumerate(reps):
                    expected[rep_] += p * weights[1 + s]
                if extra is not None:
                    expected[extra] += p * weights[-1]
        np.testing.assert_allclose(expected, np.full(n, 1 / n), rtol=1e-6)


def test_strata_group_similar_sets_and_the_int8_sets_round_trip() -> None:
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 4, 8))
    sets = np.concatenate([c + 0.01 * rng.standard_normal((5, 4, 8)) for c in centers])
    labels = set_strata(sets.astype(np.float32), 3, seed=0, t=1)
    assert sorted(np.bincount(labels).tolist()) == [5, 5, 5]  # one stratum per group
    assert len(set(labels[:5])) == len(set(labels[5:10])) == 1
    assert set_strata(sets, 3, seed=0, t=1).tolist() == labels.tolist()  # seeded
    quantized, scale = quantize_sets(sets.astype(np.float32))
    assert quantized.dtype == np.int8
    assert scale.shape == (15, 4)
    error = np.abs(dequantize_sets(quantized, scale) - sets).max(axis=2)
    assert (error <= scale * 0.5 + 1e-6).all()


def test_above_k_plus_one_the_stratified_downlink_stays_under_300_kb() -> None:
    c, d, k = 21, 256, 8
    for n in (12, 60):
        down = _server(c, d, k, "strata").aggregate(1, _uploads(n, c, d))
        assert array(down.broadcast, "prototypes_int8").shape == (min(n, 40), c, d)
        payloads = encode_downlinks("r", 1, down.broadcast, down.personal)
        biggest = len(payloads.broadcast) + max(len(p) for p in payloads.personal.values())
        assert biggest <= 300_000
        for body in down.personal.values():
            sets = 1 + min(n, 40) + (len(array(body, "extra")) if "extra" in body else 0)
            assert array(body, "set_weights").shape == (sets,)
            assert array(body, "set_weights").sum() == pytest.approx(1.0)


def test_a_federation_trains_on_stratified_int8_sets() -> None:
    fed = Federation("fedapa", clients=5, rounds=2, max_peer_sets=2, strata=3).run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    assert client.p is not None
    assert client.p.dtype == torch.float32
    assert client.p.shape[0] in (4, 5)  # own set, 3 representatives (and an alternate)
    assert client.p_weights is not None
    assert float(client.p_weights.sum()) == pytest.approx(1.0)


def test_above_k_plus_one_every_downlink_stays_under_the_bound() -> None:
    c, d, k = 21, 256, 8
    for n in (12, 40):
        down = _server(c, d, k).aggregate(1, _uploads(n, c, d))
        assert array(down.broadcast, "prototypes").shape == (k + 1, c, d)
        payloads = encode_downlinks("r", 1, down.broadcast, down.personal)
        bound = (k + 2) * c * d * 4 + c * 4 + 2048  # S and Q_i, float32, P_i's sums, framing
        biggest = len(payloads.broadcast) + max(len(p) for p in payloads.personal.values())
        assert biggest <= bound <= 230_000
        body = down.personal["3"]
        assert "own" not in body  # the client rebuilds its own set from its upload
        assert array(body, "own_sums").shape == (c,)
        assert array(body, "set_weights").shape == (k + 2,)


@pytest.mark.parametrize("sampling", ["uniform", "strata"])
def test_a_client_rebuilds_its_own_padded_set_from_its_upload_and_q(sampling: str) -> None:
    """P_i = the upload padded by Eq. 8 with the class means, which Q_i holds for the
    classes i lacks: the rebuilt set is the server's padded row, bit for bit."""
    c, d, k, n = 6, 8, 2, 7
    uploads = _uploads(n, c, d)
    down = _server(c, d, k, sampling).aggregate(1, uploads)
    protos, mask = stack_uploads(uploads, c, d)
    _, padded, _ = aggregate_prototypes(protos, mask, tau=0.5)
    for row, upload in enumerate(uploads):
        body = down.personal[upload.client_id]
        own = rebuild_own_set(
            array(upload.body, "classes"),
            array(upload.body, "prototypes"),
            array(body, "q"),
            array(body, "own_sums"),
        )
        assert own is not None
        np.testing.assert_array_equal(own, padded[row])
    other = uploads[1].body  # another round's (or client's) upload does not pass the sums
    assert (
        rebuild_own_set(
            array(other, "classes"),
            array(other, "prototypes"),
            array(body, "q"),
            array(body, "own_sums"),
        )
        is None
    )


def test_a_client_whose_kept_upload_is_not_the_aggregated_one_leaves_l_c_out() -> None:
    fed = Federation("fedapa", clients=5, rounds=1, max_peer_sets=2, sampling="uniform").run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    assert client.sent is not None
    c, d = client.ctx.num_classes, client.ctx.embed_dim
    broadcast = {"available": np.ones(c, np.uint8), "prototypes": np.zeros((3, c, d), np.float32)}
    personal = {
        "q": np.zeros((c, d), np.float32),
        "own_sums": np.full(c, 1e3, np.float32),  # not what this client uploaded
        "set_weights": np.full(4, 0.25, np.float32),
    }
    client.check_downlink(broadcast, personal)
    client.receive(2, broadcast, personal)
    assert client.p is None
    assert client.q is not None
    client.sent = None  # a restarted client that kept nothing
    client.receive(3, broadcast, personal)
    assert client.p is None
    # weights without the sums that rebuild the own set are refused
    without_sums = {k: v for k, v in personal.items() if k != "own_sums"}
    with pytest.raises(WireError, match="own set"):
        client.check_downlink(broadcast, without_sums)


def test_a_federation_above_the_bound_trains_on_sampled_sets() -> None:
    fed = Federation("fedapa", clients=5, rounds=2, max_peer_sets=2, sampling="uniform").run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    assert client.p is not None
    assert client.p.shape[0] == 4
    assert client.p_weights is not None
    assert float(client.p_weights.sum()) == pytest.approx(1.0)


def test_sample_weights_that_do_not_fit_the_broadcast_sample_drop_l_c_for_the_round() -> None:
    fed = Federation("fedapa", clients=5, rounds=1, max_peer_sets=2, sampling="uniform").run()
    client = fed.clients[0]
    assert isinstance(client, FedAPAClient)
    c, d = client.ctx.num_classes, client.ctx.embed_dim
    broadcast = {
        "available": np.ones(c, np.uint8),
        "prototypes": np.zeros((3, c, d), np.float32),
    }
    assert client.sent is not None
    q = np.zeros((c, d), np.float32)
    padded = q.copy()
    padded[client.sent[0]] = client.sent[1]
    personal = {
        "q": q,
        "own_sums": own_set_sums(padded[None])[0],  # its own set does rebuild
        "set_weights": np.full(2, 0.5, np.float32),  # S has 3 sets: 4 weights expected
    }
    client.check_downlink(broadcast, None)
    client.check_downlink({}, personal)
    client.receive(2, broadcast, personal)
    assert client.p is None
    assert client.p_weights is None
    assert client.q is not None
