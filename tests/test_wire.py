"""Codec round-trips and rejections, topic parsing, payload schemas."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttfl.errors import WireError
from mqttfl.wire import ArrayField, IntField, Message, PayloadSchema, Topics, decode, encode
from mqttfl.wire.codec import ARRAY_EXT
from mqttfl.wire.topics import DownTopic, StartTopic, StateTopic, StatusTopic, UploadTopic


def _msg(body: dict[str, Any]) -> Message:
    return Message("upload", "run", 3, "7", body)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int8", "uint8", "bool", ">f4"])
def test_arrays_round_trip_bit_exact(dtype: str) -> None:
    array = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    out = decode(encode(_msg({"a": array, "n": 5, "s": "x", "nested": {"b": array[0]}})))
    assert out.body["a"].shape == (2, 3, 4)
    np.testing.assert_array_equal(out.body["a"], array)
    np.testing.assert_array_equal(out.body["nested"]["b"], array[0])
    assert out.body["a"].flags.writeable
    assert (out.type, out.run, out.round, out.sender, out.version) == ("upload", "run", 3, "7", 1)


def test_arrays_travel_as_raw_bytes_not_lists() -> None:
    array = np.random.default_rng(0).standard_normal((21, 256)).astype(np.float32)
    raw = encode(_msg({"p": array}))
    assert array.nbytes <= len(raw) <= array.nbytes + 120


def _raw_array(dtype: str, shape: list[int], data: bytes) -> bytes:
    ext = msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, shape, data]))
    envelope = {
        "v": 1,
        "type": "upload",
        "run": "run",
        "round": 1,
        "sender": "1",
        "body": {"a": ext},
    }
    raw: bytes = msgpack.packb(envelope, use_bin_type=True)
    return raw


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xc1", "malformed"),
        (encode(_msg({"a": np.ones(100, np.float32)}))[:-10], "malformed"),
        (msgpack.packb([1, 2, 3]), "malformed"),
        (_raw_array("<f4", [10**12, 10**6], b"\0" * 16), "size"),
        (_raw_array("<f4", [4], b"\0" * 15), "size"),
        (_raw_array("|O", [1], b"\0" * 8), "dtype"),
        (_raw_array("<c8", [1], b"\0" * 8), "dtype"),
        (_raw_array("<f4", [-1], b""), "shape"),
        (_raw_array("<f4", [1] * 9, b"\0" * 4), "shape"),
        (
            msgpack.packb({"v": 1, "type": "upload", "run": "r", "round": 1, "sender": "1"}),
            "envelope",
        ),
        (
            msgpack.packb(
                {"v": 2, "type": "upload", "run": "r", "round": 1, "sender": "1", "body": {}}
            ),
            "version",
        ),
        (
            msgpack.packb(
                {"v": 1, "type": "pwn", "run": "r", "round": 1, "sender": "1", "body": {}}
            ),
            "type",
        ),
        (
            msgpack.packb(
                {"v": 1, "type": "upload", "run": "r", "round": -1, "sender": "1", "body": {}}
            ),
            "envelope",
        ),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "type": "upload",
                    "run": "r",
                    "round": 1,
                    "sender": "1",
                    "body": {},
                    "extra": 1,
                }
            ),
            "envelope",
        ),
    ],
)
def test_decode_rejects_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode(raw)
    assert info.value.reason == reason


def test_decode_rejects_oversize_before_parsing() -> None:
    with pytest.raises(WireError) as info:
        decode(b"\0" * 2000, max_bytes=1000)
    assert info.value.reason == "oversize"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decode_of_arbitrary_bytes_only_raises_wire_errors(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode(raw)


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=64),
    st.lists(st.integers(min_value=0, max_value=2**40), max_size=4),
    st.sampled_from(["<f4", "<i8", "|u1", "<f8"]),
)
def test_declared_shape_must_match_the_bytes(data: bytes, shape: list[int], dtype: str) -> None:
    reason: str | None
    try:
        out = decode(_raw_array(dtype, shape, data))
    except WireError as exc:
        reason = exc.reason
    else:
        reason = None
        assert out.body["a"].nbytes == len(data)
    assert reason in {None, "size", "shape"}


def test_topics_build_and_parse() -> None:
    topics = Topics("run-1")
    assert topics.up(4, "7") == "mqttfl/run-1/round/4/up/7"
    assert topics.parse(topics.up(4, "7")) == UploadTopic(4, "7")
    assert topics.parse(topics.down_all(2)) == DownTopic(2, "all")
    assert topics.parse(topics.start(9)) == StartTopic(9)
    assert topics.parse(topics.state) == StateTopic()
    assert topics.parse(topics.status("3")) == StatusTopic("3")
    for bad in (
        "mqttfl/other/state",
        "mqttfl/run-1/round/x/up/1",
        "mqttfl/run-1/round/1/sideways/1",
    ):
        with pytest.raises(WireError):
            topics.parse(bad)
    with pytest.raises(WireError):
        Topics("a/b")


SCHEMA = PayloadSchema(
    {
        "classes": ArrayField("int64", ("k",), 0, 20, unique=True),
        "prototypes": ArrayField("float32", ("k", 4)),
        "count": IntField(1, 100),
    },
    dims={"k": (1, 21)},
)


def _body(**changes: object) -> dict[str, Any]:
    body = {"classes": np.array([0, 3]), "prototypes": np.ones((2, 4), np.float32), "count": 5}
    body.update(changes)
    return body


def test_schema_accepts_a_valid_body() -> None:
    assert SCHEMA.validate(_body()) == {"k": 2}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"weights": np.ones(3, np.float32)}, "unknown_field"),
        ({"count": None}, "type"),
        ({"prototypes": np.ones((2, 4), np.float64)}, "dtype"),
        ({"prototypes": np.ones((2, 5), np.float32)}, "shape"),
        ({"prototypes": np.ones((3, 4), np.float32)}, "shape"),
        ({"prototypes": np.full((2, 4), np.nan, np.float32)}, "non_finite"),
        ({"prototypes": np.full((2, 4), np.inf, np.float32)}, "non_finite"),
        ({"classes": np.array([0, 21])}, "range"),
        ({"classes": np.array([3, 3])}, "range"),
        ({"count": 0}, "range"),
        ({"classes": np.zeros(0, np.int64), "prototypes": np.zeros((0, 4), np.float32)}, "shape"),
    ],
)
def test_schema_rejections(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(WireError) as info:
        SCHEMA.validate(_body(**changes))
    assert info.value.reason == reason


def test_schema_rejects_missing_fields() -> None:
    body = _body()
    del body["count"]
    with pytest.raises(WireError) as info:
        SCHEMA.validate(body)
    assert info.value.reason == "missing_field"
