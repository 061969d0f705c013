"""Hostile input, fuzzed: hypothesis feeds the decoder, the upload gate and the
coordinator's message handler arbitrary and mutated input and finds nothing but
WireErrors; whatever the gate accepts aggregates to finite downlinks. (The catalogue of
named attacks, in process and live, is tests/test_hostile_live.py.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mqttfl.algorithms import get_algorithm
from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Incoming
from mqttfl.config import load_config
from mqttfl.errors import RejectedUpload, WireError
from mqttfl.nodes.coordinator import Coordinator
from mqttfl.wire import Message, decode, encode
from mqttfl.wire.codec import ARRAY_EXT
from mqttfl.wire.control import Online
from mqttfl.wire.schemas import ClientInfo
from tests.hostile import CTX, INFO, SCENE, fresh_gate

# --- fuzzing ------------------------------------------------------------------------------
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=16),
)
_ext = st.builds(
    msgpack.ExtType, st.sampled_from([ARRAY_EXT, ARRAY_EXT, 0, 42]), st.binary(max_size=64)
)
_array_ext = st.builds(
    lambda dtype, shape, data: msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, shape, data])),
    st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|b1", "|O", "<c8", ">f4", "x"]),
    st.one_of(
        st.lists(st.integers(-2, 2**40), max_size=4),
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=3),
    ),
    st.binary(max_size=64),
)
_values = st.recursive(
    st.one_of(_scalars, _ext, _array_ext),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
_envelopes = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 2, "1"]),
        "type": st.sampled_from(
            ["upload", "status", "metrics", "start", "state", "downlink", "pwn"]
        ),
        "run": st.sampled_from(["run", "other"]),
        "round": st.sampled_from([3, 3, 2, 4, -1, 2**70]),
        "sender": st.sampled_from(["v", "u", "g", "x", "all", "a/b", ""]),
        "body": st.one_of(
            st.dictionaries(
                st.sampled_from(["classes", "prototypes", "counts", "weights", "x"]),
                _values,
                max_size=4,
            ),
            _values,
        ),
    },
    optional={"extra": _values},
)


@settings(max_examples=300, deadline=None)
@given(_envelopes)
def test_decoder_on_structured_garbage_only_raises_wire_errors(envelope: dict[str, Any]) -> None:
    try:
        raw = msgpack.packb(envelope, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    try:
        message = decode(raw)
    except WireError:
        return
    assert isinstance(message.body, dict)
    assert message.version == 1


def _arrays(dtypes: list[type], shapes: list[tuple[int, ...]]) -> st.SearchStrategy[np.ndarray]:
    def build(dtype: type, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        kind = np.dtype(dtype).kind
        elements = st.floats(width=32) if kind == "f" else st.integers(-3, 25)  # NaN/Inf included
        return hnp.arrays(dtype, shape, elements=elements)

    return st.tuples(st.sampled_from(dtypes), st.sampled_from(shapes)).flatmap(
        lambda ds: build(*ds)
    )


def _bodies() -> st.SearchStrategy[dict[str, Any]]:
    """Near-valid prototype bodies: right or wrong dtypes, shapes, ranges, NaN/Inf, extra fields."""

    def body(n: int) -> st.SearchStrategy[dict[str, Any]]:
        floats = _arrays(
            [np.float32, np.float32, np.float64, np.int64],
            [(n, 8), (n, 8), (n, 7), (n + 1, 8), (n,)],
        )
        ints = _arrays([np.int64, np.int64, np.int32, np.float32], [(n,), (n,), (n + 1,)])
        return st.fixed_dictionaries(
            {"classes": ints, "prototypes": floats, "counts": ints},
            optional={"weights": floats, "x": _scalars},
        )

    return st.integers(0, 4).flatmap(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies(), st.sampled_from(["v", "u", "g", "x"]), st.sampled_from([2, 3, 4]))
@example(
    body={
        "classes": np.array([0]),
        "prototypes": np.zeros((1, 8), np.float32),
        "counts": np.array([1]),
    },
    sender="x",
    t=3,
)  # a valid upload from the client the companion upload used to come from
def test_gate_accepts_only_what_aggregates_to_finite_downlinks(
    body: dict[str, Any], sender: str, t: int
) -> None:
    gate = fresh_gate()
    try:
        raw = encode(Message("upload", "run", t, sender, body))
    except WireError:
        return
    rejected: RejectedUpload | None = None
    try:
        upload = gate.check(t, sender, raw, INFO.get(sender))
    except RejectedUpload as exc:
        rejected = exc
    if rejected is not None:
        assert sum(gate.rejections.values()) == 1
        assert gate.rejections[rejected.reason] == 1
        return
    other = "v" if sender == "x" else "x"  # the other selected client: one upload each
    valid = gate.check(
        3, other, encode(Message("upload", "run", 3, other, SCENE.body())), INFO[other]
    )
    downlinks = get_algorithm("fedapa").server(CTX).aggregate(3, [upload, valid])
    for value in [
        *downlinks.broadcast.values(),
        *(v for p in downlinks.personal.values() for v in p.values()),
    ]:
        assert np.isfinite(np.asarray(value, np.float64)).all()


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=400), st.integers(0, 10_000), st.integers(0, 255))
def test_mutated_valid_uploads_are_rejected_or_still_valid(
    noise: bytes, where: int, byte: int
) -> None:
    raw = bytearray(SCENE.valid())
    mutations = [
        bytes(raw[: where % len(raw)]),
        bytes(raw[: where % len(raw)] + noise),
        bytes(raw[: where % len(raw)] + bytes([byte]) + raw[where % len(raw) + 1 :]),
    ]
    for mutated in mutations:
        gate = fresh_gate()
        try:
            upload = gate.check(3, "v", mutated, INFO["v"])
        except RejectedUpload:
            continue
        for value in upload.body.values():
            assert np.isfinite(np.asarray(value)).all()


_TOPICS = st.sampled_from(
    [
        "round/{t}/up/{c}",
        "round/{t}/metrics/{c}",
        "status/{c}",
        "round/{t}/up/all",
        "round/x/up/{c}",
        "round/{t}/up/{c}/extra",
        "state",
        "round/{t}/start",
    ]
)


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Coordinator:
    config = load_config(
        "configs/fedapa-csi.toml", ["model.embed_dim=8", "run_id=run", "method=fedapa"]
    )
    coordinator = Coordinator(
        config, BrokerAddress.parse("mqtt://127.0.0.1:1"), tmp_path_factory.mktemp("c")
    )
    coordinator.process(Incoming("mqttfl/run/status/v", Online(INFO["v"]).encode("run")))
    coordinator.gate.open_round(3, ["v"], keep=False)
    return coordinator


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    _TOPICS,
    st.sampled_from(["v", "u", "g", "zz"]),
    st.sampled_from([2, 3, 4]),
    st.one_of(_envelopes.map(lambda e: _pack(e)), st.binary(max_size=64)),
)
def test_coordinator_handler_survives_anything_on_its_topics(
    coordinator: Coordinator, topic: str, client: str, t: int, payload: bytes
) -> None:
    incoming = Incoming(f"mqttfl/run/{topic.format(t=t, c=client)}", payload)
    # logged as message.rejected by the dispatcher; anything else would kill the run
    with contextlib.suppress(WireError):
        coordinator.process(incoming)


def _pack(envelope: dict[str, Any]) -> bytes:
    try:
        raw: bytes = msgpack.packb(envelope, use_bin_type=True)
        return raw
    except (OverflowError, ValueError):
        return b""


@pytest.fixture(scope="module")
def weights_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Coordinator:
    config = load_config(
        "configs/fedapa-csi.toml", ["run_id=run", "method=fedavg", "model.name=tiny"]
    )
    return Coordinator(
        config, BrokerAddress.parse("mqtt://127.0.0.1:1"), tmp_path_factory.mktemp("w")
    )


_status_bodies = st.fixed_dictionaries(
    {"state": st.sampled_from(["online", "online", "offline", "x"])},
    optional={
        "arch": st.one_of(
            st.sampled_from(["tiny", "middle", "mlp", "large"]), st.text(max_size=6), _scalars
        ),
        "classes": st.one_of(st.lists(st.integers(-5, 30), max_size=4), _scalars),
        "num_samples": st.one_of(st.integers(-5, 10**12), _scalars),
        "sample_shape": st.one_of(st.lists(st.integers(-2, 300), max_size=4), _scalars),
        "reason": _scalars,
    },
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_status_bodies, st.sampled_from(["a", "b"]))
def test_any_announcement_then_an_upload_is_rejected_or_served(
    weights_coordinator: Coordinator, body: dict[str, Any], client: str
) -> None:
    """Statuses with any model, shape or counts, then an upload from that client: WireErrors only."""
    coordinator = weights_coordinator
    coordinator.gate.open_round(1, [client], keep=False)
    status = _pack(
        {"v": 1, "type": "status", "run": "run", "round": 0, "sender": client, "body": body}
    )
    upload = encode(
        Message("upload", "run", 1, client, {"weights": np.zeros(3, np.float32), "num_samples": 1})
    )
    for topic, payload in ((f"status/{client}", status), (f"round/1/up/{client}", upload)):
        with contextlib.suppress(WireError):
            coordinator.process(Incoming(f"mqttfl/run/{topic}", payload))


@pytest.mark.parametrize("shape", [[10**9], [0], [], [64] * 5])
def test_an_announced_sample_shape_cannot_make_the_coordinator_build_a_giant_model(
    weights_coordinator: Coordinator, shape: list[int]
) -> None:
    body = {
        "state": "online",
        "arch": "mlp",
        "classes": [0],
        "num_samples": 5,
        "sample_shape": shape,
    }
    status = _pack(
        {"v": 1, "type": "status", "run": "run", "round": 0, "sender": "m", "body": body}
    )
    with pytest.raises(WireError) as info:
        weights_coordinator.process(Incoming("mqttfl/run/status/m", status))
    assert info.value.reason == "range"
    assert "m" not in weights_coordinator.clients


def test_a_status_the_method_cannot_serve_is_rejected_not_fatal(tmp_path: Path) -> None:
    config = load_config("configs/fedapa-csi.toml", ["run_id=run", "method=fedavg"])
    coordinator = Coordinator(config, BrokerAddress.parse("mqtt://127.0.0.1:1"), tmp_path)
    bogus = ClientInfo("v", "no-such-model", (0,), 40, (24, 52))
    with pytest.raises(WireError):
        coordinator.process(Incoming("mqttfl/run/status/v", Online(bogus).encode("run")))
    assert "v" not in coordinator.clients
