"""FedAPA's Eqs. 5-7 summed while uploads arrive equal the batched product (float32)."""

from __future__ import annotations

import numpy as np
import pytest

from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.common.prototype_uploads import stack_uploads, uploaded_prototypes
from mqttfl.algorithms.fedapa import (
    FedAPAParams,
    FedAPAServer,
    aggregate_prototypes,
    personalized_prototypes,
)
from mqttfl.algorithms.fedapa.fanin import BLOCK, FanIn
from mqttfl.wire.schemas import ClientInfo

C, D = 5, 12


def _uploads(n: int, seed: int) -> list[Upload]:
    rng = np.random.default_rng(seed)
    uploads = []
    for i in range(n):
        classes = np.sort(rng.choice(C, size=int(rng.integers(1, C + 1)), replace=False))
        protos = rng.standard_normal((len(classes), D)).astype(np.float32)
        if i == 3:
            protos[0] = 0.0  # a held class whose prototype is the zero vector
        info = ClientInfo(f"c{i:02d}", "tiny", tuple(classes.tolist()), 10, (8, 6))
        uploads.append(Upload(f"c{i:02d}", info, {"classes": classes, "prototypes": protos}))
    return uploads


@pytest.mark.parametrize("n", [1, 2, BLOCK - 1, BLOCK, 2 * BLOCK + 5, 200])
@pytest.mark.parametrize("tau", [0.5, 0.07])
def test_the_fan_in_equals_eq_7_batched_in_any_arrival_order(n: int, tau: float) -> None:
    uploads = _uploads(n, seed=n)
    fan_in = FanIn(1, C, D, tau)
    for u in np.random.default_rng(0).permutation(np.array(uploads, dtype=object)):
        fan_in.add(u.client_id, uploaded_prototypes(u))
    clients = sorted(u.client_id for u in uploads)
    q, protos, mask = fan_in.personalized(clients)
    ordered = sorted(uploads, key=lambda u: u.client_id)
    expected_protos, expected_mask = stack_uploads(ordered, C, D)
    np.testing.assert_array_equal(protos, expected_protos)
    np.testing.assert_array_equal(mask, expected_mask)
    expected = personalized_prototypes(expected_protos, expected_mask, tau)
    np.testing.assert_allclose(q[mask], expected[mask], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("n", [6, BLOCK])
def test_a_round_of_one_block_gives_the_same_bits_in_every_arrival_order(n: int) -> None:
    """The same seed gives the same table however the uploads raced: float32 sums depend
    on their order, so a block is summed in client order (two arrival orders of six
    uploads would otherwise differ by up to 5e-7, and a run's accuracy by points after
    15 rounds)."""
    uploads = _uploads(n, seed=3)
    clients = sorted(u.client_id for u in uploads)
    results = []
    for order in range(5):
        fan_in = FanIn(1, C, D, 0.5)
        arrivals = np.random.default_rng(order).permutation(np.array(uploads, dtype=object))
        for u in arrivals:
            fan_in.add(u.client_id, uploaded_prototypes(u))
        results.append(fan_in.personalized(clients))
    for q, protos, mask in results[1:]:
        assert q.tobytes() == results[0][0].tobytes()
        assert protos.tobytes() == results[0][1].tobytes()
        assert mask.tobytes() == results[0][2].tobytes()


def test_the_server_aggregates_the_same_with_and_without_the_fan_in() -> None:
    uploads = _uploads(2 * BLOCK + 3, seed=7)
    ctx = Context(C, D, 10, 0, FedAPAParams(max_peer_sets=4))
    warm, cold = FedAPAServer(ctx), FedAPAServer(ctx)
    for u in reversed(uploads):
        warm.prepare(1, u)
    assert warm.fan_in is not None
    fast, slow = warm.aggregate(1, uploads), cold.aggregate(1, uploads)
    assert warm.fan_in is None  # spent: a retry or the next round starts over
    for client, body in slow.personal.items():
        np.testing.assert_allclose(fast.personal[client]["q"], body["q"], rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(fast.personal[client]["set_weights"], body["set_weights"])
    np.testing.assert_array_equal(fast.broadcast["available"], slow.broadcast["available"])


def test_a_round_that_aggregates_other_uploads_than_arrived_takes_the_batched_path() -> None:
    uploads = _uploads(6, seed=3)
    ctx = Context(C, D, 10, 0, FedAPAParams())
    server = FedAPAServer(ctx)
    for u in uploads:
        server.prepare(1, u)
    kept = uploads[:-1]  # one dropped from the aggregate (aggregate_checked's retry)
    assert server.fan_in is not None
    assert not server.fan_in.covers(1, [u.client_id for u in kept], [u.body for u in kept])
    down = server.aggregate(1, kept)
    protos, mask = stack_uploads(kept, C, D)
    q, _, _ = aggregate_prototypes(protos, mask, tau=0.5)
    for row, u in enumerate(kept):
        np.testing.assert_array_equal(down.personal[u.client_id]["q"], q[row])
    # another round's arrivals, or another upload object for the same client, do not count
    fan_in = FanIn(2, C, D, 0.5)
    for u in uploads:
        fan_in.add(u.client_id, uploaded_prototypes(u))
    ids, bodies = [u.client_id for u in uploads], [u.body for u in uploads]
    assert fan_in.covers(2, ids, bodies)
    assert not fan_in.covers(3, ids, bodies)
    assert not fan_in.covers(2, ids, [dict(b) for b in bodies])


def test_mean_aggregation_and_weighted_rounds_keep_no_fan_in() -> None:
    uploads = _uploads(3, seed=1)
    mean = FedAPAServer(Context(C, D, 10, 0, FedAPAParams(aggregation="mean")))
    mean.prepare(1, uploads[0])
    assert mean.fan_in is None
    # buffered mode passes staleness weights: the unweighted fan-in is not used
    weighted = FedAPAServer(Context(C, D, 10, 0, FedAPAParams()))
    for u in uploads:
        weighted.prepare(1, u)
    stale = {"c00": 0.5, "c01": 1.0, "c02": 1.0}
    down = weighted.aggregate(1, uploads, stale)
    protos, mask = stack_uploads(uploads, C, D)
    q, _, _ = aggregate_prototypes(protos, mask, tau=0.5, weights=np.array([0.5, 1.0, 1.0]))
    for row, u in enumerate(uploads):
        np.testing.assert_array_equal(down.personal[u.client_id]["q"], q[row])
