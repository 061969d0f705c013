"""Buffered mode (FedBuff) of the round engine on its test clock: the buffer, staleness
and its weights, the delta average, the latest prototype sets, the checkpoint."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.algorithms.common.weights import group_key, weights_length
from mqttfl.algorithms.fedapa import aggregate_prototypes
from mqttfl.config import FederationConfig, ModelConfig, RunConfig, TrainConfig, load_config
from mqttfl.engine.actions import Announce, Close, Keep
from mqttfl.engine.buffered import BufferedEngine, engine_for, staleness_weight
from mqttfl.engine.rounds import RoundEngine
from mqttfl.engine.state import RunState
from mqttfl.errors import ConfigError, RejectedUpload
from mqttfl.testing.clocked import ClockedFederation, FakeClock
from mqttfl.wire import Message, encode
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import Online, read_status
from mqttfl.wire.downlinks import read_downlink
from mqttfl.wire.schemas import ClientInfo
from tests.inprocess import toy_shard

RUN = "r"


def config(method: str = "fedavg", **federation: Any) -> RunConfig:
    fed = {
        "num_clients": 4,
        "min_clients": 1,
        "round_timeout_s": 60.0,
        "mode": "buffered",
        "buffer_size": 2,
        "max_staleness": 3,
        **federation,
    }
    return RunConfig(
        run_id=RUN,
        method=method,
        rounds=6,
        federation=FederationConfig(**fed),
        model=ModelConfig(name="tiny", embed_dim=8, num_classes=4),
        train=TrainConfig(batch_size=8),
    )


def clocked(cfg: RunConfig, slow: dict[str, float]) -> ClockedFederation:
    """Clients 0..N-1 on toy shards; each trains in 1 s of the test clock, or ``slow[c]``."""
    shards = {str(i): toy_shard(i) for i in range(cfg.federation.num_clients)}
    return ClockedFederation(cfg, shards, seconds=lambda c, _: slow.get(c, 1.0))


# --- config ------------------------------------------------------------------------------
def test_rounds_stay_the_default_and_build_the_synchronous_engine() -> None:
    cfg = RunConfig(run_id=RUN)
    assert cfg.federation.mode == "rounds"
    ctx = make_context(cfg)
    engine = engine_for(cfg)(cfg, get_algorithm(cfg.method), ctx, clock=FakeClock())
    assert type(engine) is RoundEngine


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("federation.mode=async", "federation.mode"),
        ("federation.buffer_size=0", "federation.buffer_size"),
        ("federation.max_staleness=-1", "federation.max_staleness"),
        ("federation.staleness_weighting=linear", "federation.staleness_weighting"),
        ("federation.buffer_size=7", "federation.buffer_size"),  # more than 6 clients
    ],
)
def test_a_bad_buffered_setting_names_its_key(override: str, key: str) -> None:
    overrides = ["federation.mode=buffered", override]
    with pytest.raises(ConfigError) as caught:
        load_config("configs/fedapa-csi.toml", overrides)
    assert caught.value.key == key


def test_staleness_weights_follow_fedbuff_and_fedasync() -> None:
    fedbuff = FederationConfig(staleness_weighting="fedbuff")
    poly = FederationConfig(staleness_weighting="polynomial", staleness_exponent=2.0)
    const = FederationConfig(staleness_weighting="constant")
    for tau in range(6):
        assert staleness_weight(tau, fedbuff) == pytest.approx(1 / math.sqrt(1 + tau))
        assert staleness_weight(tau, poly) == pytest.approx((1 + tau) ** -2.0)
        assert staleness_weight(tau, const) == 1.0


# --- the buffer on the clock ---------------------------------------------------------------
def test_versions_close_on_the_buffer_without_waiting_for_the_slow_client() -> None:
    fed = clocked(config(max_staleness=6), slow={"3": 5.0})
    trace = fed.run()
    times = [t for t, _, _ in trace.closes]
    assert [v for _, v, _ in trace.closes] == [1, 2, 3, 4, 5, 6]
    # The fast clients fill the buffer every second; the slow one never holds a version up.
    assert times == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    slow = [(r, t) for t, c, r, _ in trace.uploads if c == "3"]
    assert slow
    assert slow[0] == (1, 5.0)
    assert trace.summary is not None
    assert trace.summary.buffered is not None
    assert trace.summary.buffered.staleness["4"] >= 1  # ...and was aggregated
    assert not [r for r in trace.rejected if r[3] == "too_stale"]


def test_the_slow_client_trains_on_the_newest_version_it_holds() -> None:
    fed = clocked(config(max_staleness=6), slow={"3": 5.0})
    trace = fed.run()
    sent = sorted([*trace.uploads, *trace.rejected])  # by time; the last comes after the end
    rounds = [r for _, c, r, _ in sent if c == "3"]
    # at 5 s it had versions 1-4 waiting: it skipped the starts of rounds 2-5 for 6
    assert rounds[:2] == [1, 6]


def test_an_upload_older_than_max_staleness_is_refused_and_counted() -> None:
    fed = clocked(config(max_staleness=2), slow={"3": 5.0})
    trace = fed.run()
    refused = [(c, r) for _, c, r, reason in trace.rejected if reason == "too_stale"]
    assert ("3", 1) in refused
    assert trace.summary is not None
    assert trace.summary.rejections["too_stale"] == len(refused)
    assert trace.summary.buffered is not None
    assert trace.summary.buffered.too_stale == len(refused)
    assert all(int(tau) <= 2 for tau in trace.summary.buffered.staleness)


def test_a_dead_client_does_not_stall_the_buffer() -> None:
    fed = clocked(config(num_clients=3, buffer_size=3), slow={})
    fed.until(lambda f: f.engine.state.round >= 1)
    fed.kill("2")
    trace = fed.run()
    assert trace.summary is not None
    assert trace.summary.rounds_completed == 6
    # with two live clients the buffer closes on two uploads, at once, not at a deadline
    assert trace.closes[-1][0] < fed.config.federation.round_timeout_s


# --- what is aggregated ------------------------------------------------------------------
class Driver:
    """A buffered engine fed by hand: uploads of chosen bodies, on a fake clock."""

    def __init__(self, cfg: RunConfig, clients: int = 3) -> None:
        self.cfg = cfg
        self.ctx = make_context(cfg)
        self.algorithm = get_algorithm(cfg.method)
        self.clock = FakeClock()
        engine = engine_for(cfg)(cfg, self.algorithm, self.ctx, clock=self.clock)
        assert isinstance(engine, BufferedEngine)
        self.engine = engine
        self.infos = [
            ClientInfo(str(i), "tiny", (0, 1, 2, 3), 10 * (i + 1), (8, 6)) for i in range(clients)
        ]
        for info in self.infos:
            self.engine.on_status(
                read_status(Online(info).encode(RUN), run_id=RUN, client=info.client_id)
            )
        self.actions = self.engine.step()

    def upload(self, t: int, client: int, body: dict[str, Any]) -> list[Any]:
        raw = encode(Message("upload", RUN, t, str(client), body))
        self.engine.on_upload(t, str(client), raw)
        self.actions = self.engine.step()
        return self.actions

    def broadcast(self) -> dict[str, Any]:
        close = next(a for a in self.actions if isinstance(a, Close))
        return dict(
            read_downlink(
                close.payloads.broadcast, run_id=RUN, round=close.round, client="all"
            ).body
        )


def test_fedavg_takes_the_staleness_weighted_average_of_deltas() -> None:
    d = Driver(config("fedavg", num_clients=3, buffer_size=2))
    n = weights_length(d.ctx, d.infos[0])
    rng = np.random.default_rng(0)
    w = {k: rng.normal(size=n).astype(np.float32) for k in ("a0", "a1", "b0", "b1", "c2", "c0")}

    def body(key: str, client: int) -> dict[str, Any]:
        return {"weights": w[key], "num_samples": d.infos[client].num_samples}

    key = group_key(d.infos[0])
    d.upload(1, 0, body("a0", 0))
    d.upload(1, 1, body("a1", 1))
    v1 = d.broadcast()["weights"][key]  # round 1: no published base, a plain FedAvg
    np.testing.assert_allclose(v1, (10 * w["a0"] + 20 * w["a1"]) / 30, rtol=1e-5, atol=1e-6)
    d.upload(2, 0, body("b0", 0))
    d.upload(2, 1, body("b1", 1))
    v2 = d.broadcast()["weights"][key]
    # round 3 open: client 2's work on version 1 (round 2) is one version stale
    d.upload(2, 2, body("c2", 2))
    assert not any(isinstance(a, Close) for a in d.actions)
    assert any(isinstance(a, Keep) for a in d.actions)
    d.upload(3, 0, body("c0", 0))
    v3 = d.broadcast()["weights"][key]
    s1 = 1 / math.sqrt(2)
    expected = v2 + (30 * s1 * (w["c2"] - v1) + 10 * (w["c0"] - v2)) / 40
    np.testing.assert_allclose(v3, expected, rtol=1e-4, atol=1e-5)


def proto_body(value: float) -> dict[str, Any]:
    return {
        "classes": np.arange(4, dtype=np.int64),
        "prototypes": np.full((4, 8), value, np.float32),
    }


def test_prototype_methods_keep_every_clients_latest_set_and_down_weight_stale_ones() -> None:
    d = Driver(config("fedproto", num_clients=3, buffer_size=1))
    d.upload(1, 0, proto_body(1.0))
    np.testing.assert_allclose(d.broadcast()["prototypes"], 1.0)
    d.upload(2, 1, proto_body(4.0))  # client 0's round-1 set is one version old now
    s1 = 1 / math.sqrt(2)
    np.testing.assert_allclose(d.broadcast()["prototypes"], (s1 * 1.0 + 4.0) / (s1 + 1), rtol=1e-6)
    d.upload(3, 0, proto_body(2.0))  # client 0's newer set replaces its older one
    s1_for_1 = s1  # client 1's set (round 2) is one version old at round 3
    np.testing.assert_allclose(
        d.broadcast()["prototypes"], (2.0 + s1_for_1 * 4.0) / (1 + s1_for_1), rtol=1e-6
    )


def test_fedapa_weights_each_peer_set_by_its_staleness() -> None:
    rng = np.random.default_rng(1)
    protos = rng.normal(size=(3, 4, 8)).astype(np.float32)
    mask = np.ones((3, 4), bool)
    mask[2, 1] = False
    q, p, _ = aggregate_prototypes(protos, mask, tau=0.5)
    q1, p1, _ = aggregate_prototypes(protos, mask, tau=0.5, weights=np.ones(3))
    np.testing.assert_allclose(q1, q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p1, p, rtol=1e-5, atol=1e-6)
    # a peer weighted almost to nothing drops out of everyone else's Q_i and Eq. 8's mean
    qw, pw, _ = aggregate_prototypes(protos, mask, tau=0.5, weights=np.array([1.0, 1.0, 1e-9]))
    q2, p2, _ = aggregate_prototypes(protos[:2], mask[:2], tau=0.5)
    np.testing.assert_allclose(qw[:2], q2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pw[2, 1], p2[:, 1].mean(axis=0), rtol=1e-4, atol=1e-5)


# --- the checkpoint --------------------------------------------------------------------
def test_a_restarted_engine_keeps_the_version_counter_and_the_buffer() -> None:
    d = Driver(config("fedproto", num_clients=3, buffer_size=2))
    d.upload(1, 0, proto_body(1.0))
    d.upload(1, 1, proto_body(2.0))  # version 1
    keep = next(a for a in d.upload(2, 2, proto_body(3.0)) if isinstance(a, Keep))
    state = RunState.from_dict(unpack_data(pack_data(keep.checkpoint)), d.cfg, source="test")
    assert state.round == 1
    clock = FakeClock()
    again = engine_for(d.cfg)(d.cfg, d.algorithm, d.ctx, clock=clock, state=state)
    assert isinstance(again, BufferedEngine)
    assert set(again.buffer.entries) == {(2, "2")}
    assert set(again.latest) == {"0", "1"}
    for info in d.infos:
        again.on_status(read_status(Online(info).encode(RUN), run_id=RUN, client=info.client_id))
    actions = again.step()
    start = next(a for a in actions if isinstance(a, Announce)).start
    assert start.round == 2
    assert start.uploaded == ("2",)
    with pytest.raises(RejectedUpload) as caught:
        again.on_upload(2, "2", encode(Message("upload", RUN, 2, "2", proto_body(3.0))))
    assert caught.value.reason == "duplicate"
    again.on_upload(2, "0", encode(Message("upload", RUN, 2, "0", proto_body(5.0))))
    close = next(a for a in again.step() if isinstance(a, Close))
    assert close.round == 2
    assert close.log["uploads"] == 2
