"""Buffered mode under attack, on the engine's clock: no one client can fill the buffer
(one entry per client, a newer upload replaces its own older one), each entry counts
with its own staleness weight, and an upload that reaches a restarted coordinator
before its sender's status is held and decided when the status arrives."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from mqttfl.algorithms.common.weights import group_key, weights_length
from mqttfl.engine.actions import Close, Keep
from mqttfl.engine.buffered import BufferedEngine, engine_for
from mqttfl.engine.state import RunState
from mqttfl.errors import RejectedUpload
from mqttfl.testing.clocked import FakeClock
from mqttfl.wire import Message, encode
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import Online, read_status
from tests.test_buffered_engine import RUN, Driver, config, proto_body


def closes(actions: list[Any]) -> list[Close]:
    return [a for a in actions if isinstance(a, Close)]


def test_one_client_cannot_close_a_version_with_a_burst_of_withheld_uploads() -> None:
    """Client 2 acknowledges every start and withholds; after version 4 it sends its
    updates of rounds 2, 3 and 4 at once. Each newer one replaces its older one, so the
    buffer (size 2) still waits for a second client, and the version it closes with
    client 0 counts client 2 once, with the weight of its own staleness."""
    d = Driver(config("fedavg", num_clients=3, buffer_size=2, max_staleness=3))
    n = weights_length(d.ctx, d.infos[0])
    rng = np.random.default_rng(0)
    key = group_key(d.infos[0])
    versions: dict[int, np.ndarray] = {}

    def body(client: int, target: np.ndarray | None = None) -> dict[str, Any]:
        weights = rng.normal(size=n).astype(np.float32) if target is None else target
        return {"weights": weights, "num_samples": d.infos[client].num_samples}

    for t in range(1, 5):  # versions 1-4, closed by the honest clients 0 and 1
        d.upload(t, 0, body(0))
        d.upload(t, 1, body(1))
        versions[t] = d.broadcast()["weights"][key]
    target = np.full(n, 7.0, np.float32)  # where client 2 wants the model
    for t in (2, 3, 4):
        assert closes(d.upload(t, 2, body(2, target))) == []
    assert list(d.engine.buffer.entries) == [(4, "2")]
    for older in (2, 3):  # replaced: neither counts, nor can be sent again
        with pytest.raises(RejectedUpload) as refused:
            d.upload(older, 2, body(2, target))
        assert refused.value.reason == "duplicate"
    honest = body(0)
    [close] = closes(d.upload(5, 0, honest))
    assert close.log["uploads"] == 2
    assert close.log["staleness"] == {"0": 0, "2": 1}
    v5 = d.broadcast()["weights"][key]
    n0, n2 = d.infos[0].num_samples, d.infos[2].num_samples
    s1 = 1 / math.sqrt(2)  # client 2's entry trained on version 3: one version stale
    expected = versions[4] + (
        n0 * (honest["weights"] - versions[4]) + n2 * s1 * (target - versions[3])
    ) / (n0 + n2)
    np.testing.assert_allclose(v5, expected, rtol=1e-4, atol=1e-5)
    assert float(np.linalg.norm(v5 - target)) > 1.0  # not the attacker's model


def test_an_older_upload_after_a_newer_one_of_the_same_client_is_superseded() -> None:
    d = Driver(config("fedproto", num_clients=3, buffer_size=3, max_staleness=3))
    d.upload(1, 0, proto_body(1.0))
    d.upload(1, 1, proto_body(1.0))
    d.upload(1, 2, proto_body(1.0))  # version 1
    d.upload(2, 0, proto_body(2.0))
    d.upload(2, 1, proto_body(2.0))
    d.upload(2, 2, proto_body(2.0))  # version 2
    d.upload(3, 0, proto_body(3.0))  # round 3 open: client 0's entry of round 3
    with pytest.raises(RejectedUpload) as refused:
        d.engine.on_upload(2, "0", encode(Message("upload", RUN, 2, "0", proto_body(9.0))))
    assert refused.value.reason in ("duplicate", "superseded")
    assert list(d.engine.buffer.entries) == [(3, "0")]


def test_an_upload_before_its_senders_status_is_held_and_decided_when_it_comes() -> None:
    """A restarted coordinator: client 2's upload of round 1, one version stale, queued by
    the broker across the crash, arrives before client 2's ``online``. It is held, not
    refused as from an unknown client (nothing would ask for it again: only the open
    round is announced), and enters the buffer once the status comes, counted once."""
    d = Driver(config("fedproto", num_clients=3, buffer_size=2))
    d.upload(1, 0, proto_body(1.0))
    d.upload(1, 1, proto_body(1.0))  # version 1
    keep = next(a for a in d.upload(2, 1, proto_body(2.0)) if isinstance(a, Keep))
    state = RunState.from_dict(unpack_data(pack_data(keep.checkpoint)), d.cfg, source="test")
    again = engine_for(d.cfg)(d.cfg, d.algorithm, d.ctx, clock=FakeClock(), state=state)
    assert isinstance(again, BufferedEngine)
    raw = encode(Message("upload", RUN, 1, "2", proto_body(3.0)))
    assert again.on_upload(1, "2", raw) is None  # held
    assert again.state.rejections == {}
    assert (1, "2") not in again.buffer.entries
    info = d.infos[2]
    again.on_status(read_status(Online(info).encode(RUN), run_id=RUN, client="2"))
    assert set(again.buffer.entries) == {(1, "2"), (2, "1")}
    with pytest.raises(RejectedUpload) as again_sent:
        again.on_upload(1, "2", raw)
    assert again_sent.value.reason == "duplicate"


def test_an_upload_of_a_client_the_checkpoint_never_knew_is_still_refused() -> None:
    d = Driver(config("fedproto", num_clients=3, buffer_size=3))
    for client in range(3):
        d.upload(1, client, proto_body(1.0))
    state = RunState.from_dict(unpack_data(pack_data(d.engine.checkpoint())), d.cfg, source="test")
    again = engine_for(d.cfg)(d.cfg, d.algorithm, d.ctx, clock=FakeClock(), state=state)
    raw = encode(Message("upload", RUN, 1, "9", proto_body(3.0)))
    with pytest.raises(RejectedUpload) as refused:
        again.on_upload(1, "9", raw)
    assert refused.value.reason in ("unknown_client", "duplicate", "stale")
