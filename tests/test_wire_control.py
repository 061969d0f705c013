"""Typed control messages and topics: round trips, every named bad case, and fuzzing that
proves only WireError ever leaves a reader (over 10,000 generated cases)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttfl.errors import WireError
from mqttfl.wire import Message, Topics, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    RoundStart,
    RunStatus,
    read_ack,
    read_metrics,
    read_run_status,
    read_start,
    read_status,
)
from mqttfl.wire.downlinks import encode_downlinks, read_downlink
from mqttfl.wire.schemas import ClientInfo
from mqttfl.wire.topics import (
    MAX_ROUND,
    AckTopic,
    DownTopic,
    MetricsTopic,
    StartTopic,
    UploadTopic,
)

RUN = "run"
TOPICS = Topics(RUN)
INFO = ClientInfo("3", "tiny", (0, 2), 40, (24, 52))
START = RoundStart(2, ("0", "3"), 30.0, {"lambda": 0.5, "semi": False}, 1, ("0",), 7)


def test_every_control_message_round_trips() -> None:
    assert read_status(Online(INFO).encode(RUN), run_id=RUN, client="3") == Online(INFO)
    assert read_status(Offline("3", "exit").encode(RUN), run_id=RUN, client="3") == Offline(
        "3", "exit"
    )
    assert read_start(START.encode(RUN), run_id=RUN, round=2) == START
    status = RunStatus("open", 2, START)
    assert read_run_status(status.encode(RUN), run_id=RUN) == status
    assert read_run_status(RunStatus("finished", 9).encode(RUN), run_id=RUN).phase == "finished"
    assert read_ack(Ack(2, "3", 7).encode(RUN), run_id=RUN, round=2, client="3") == Ack(2, "3", 7)
    metrics = Metrics(2, "3", {"accuracy": 0.5, "f1": 0.25, "mae": 1.5, "selected": True})
    assert read_metrics(metrics.encode(RUN), run_id=RUN, round=2, client="3") == metrics
    payloads = encode_downlinks(RUN, 2, {"p": np.ones(3, np.float32)}, {"3": {"q": np.zeros(2)}})
    broadcast = read_downlink(payloads.broadcast, run_id=RUN, round=2, client="all")
    assert broadcast.personal_for == ("3",)
    np.testing.assert_array_equal(broadcast.body["p"], np.ones(3, np.float32))
    personal = read_downlink(payloads.personal["3"], run_id=RUN, round=2, client="3")
    assert personal.personal_for is None
    assert personal.body["q"].shape == (2,)


def _start_body(**changes: Any) -> dict[str, Any]:
    body = START.to_body()
    body.update(changes)
    return body


def _raw(kind: str, body: Any, *, t: int = 2, sender: str = "coordinator", run: str = RUN) -> bytes:
    raw: bytes = msgpack.packb(
        {"v": 1, "type": kind, "run": run, "round": t, "sender": sender, "body": body},
        use_bin_type=True,
    )
    return raw


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_start_body(params={"lambda": math.nan}), "non_finite"),
        (_start_body(params={"lambda": "0.5"}), "type"),
        (_start_body(params={"lambda": [1]}), "type"),
        (_start_body(timeout_s=-1.0), "range"),
        (_start_body(timeout_s=math.inf), "non_finite"),
        (_start_body(selected=["0", "0"]), "range"),
        (_start_body(selected=["a/b"]), "bad_id"),
        (_start_body(selected="0"), "type"),
        (_start_body(attempt=True), "range"),
        (_start_body(deadline=1e9), "unknown_field"),
        ({"selected": ["0"]}, "missing_field"),
    ],
)
def test_a_bad_round_start_is_refused_with_its_reason(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(WireError) as info:
        read_start(_raw("start", body), run_id=RUN, round=2)
    assert info.value.reason == reason


def test_only_the_coordinator_may_start_a_round_and_only_the_topics_round() -> None:
    with pytest.raises(WireError, match="sender"):
        read_start(_raw("start", _start_body(), sender="0"), run_id=RUN, round=2)
    with pytest.raises(WireError) as info:
        read_start(START.encode(RUN), run_id=RUN, round=3)
    assert info.value.reason == "round_mismatch"
    with pytest.raises(WireError, match="run"):
        read_start(START.encode("other"), run_id=RUN, round=2)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"accuracy": math.nan, "f1": 0.1, "mae": 0.0}, "non_finite"),
        ({"accuracy": 0.1, "f1": math.inf, "mae": 0.0}, "non_finite"),
        ({"accuracy": 2e307, "f1": 0.1, "mae": 0.0}, "range"),
        ({"accuracy": 0.5, "f1": 0.1, "mae": 0.0, "extra": 2e307}, "range"),
        ({"accuracy": 0.5, "f1": 0.1}, "missing_field"),
        ({"accuracy": "1", "f1": 0.1, "mae": 0.0}, "type"),
    ],
)
def test_forged_or_absurd_metrics_are_refused(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(WireError) as info:
        read_metrics(_raw("metrics", values, sender="3"), run_id=RUN, round=2, client="3")
    assert info.value.reason == reason


def test_a_downlink_with_nan_huge_or_non_numeric_values_is_refused() -> None:
    for body, reason in (
        ({"p": np.array([np.nan], np.float32), "_personal": []}, "non_finite"),
        ({"p": np.array([3e38], np.float32), "_personal": []}, "range"),
        ({"available": "x", "_personal": []}, "type"),
        ({"p": np.ones(2), "_personal": ["0", "0"]}, "range"),
        ({"p": np.ones(2)}, "missing_field"),
        ({"a": {"b": {"c": {"d": np.ones(1)}}}, "_personal": []}, "malformed"),
    ):
        with pytest.raises(WireError) as info:
            read_downlink(
                encode(Message("downlink", RUN, 2, "coordinator", body)),
                run_id=RUN,
                round=2,
                client="all",
            )
        assert info.value.reason == reason, body


def test_a_run_status_names_its_manifests_digest_or_nothing() -> None:
    digest = "ab" * 32
    status = RunStatus("waiting", 0, instance="0123456789abcdef", settings=digest)
    assert read_run_status(status.encode(RUN), run_id=RUN).settings == digest
    assert read_run_status(RunStatus("waiting", 0).encode(RUN), run_id=RUN).settings == ""
    for bad in ["ab" * 31, "AB" * 32, "zz" * 32, 7, "ab" * 33]:
        with pytest.raises(WireError) as info:
            read_run_status(_raw("state", {"phase": "waiting", "settings": bad}), run_id=RUN)
        assert info.value.reason == "type", bad


def test_a_finished_run_status_has_no_start_and_an_open_one_has_its_own() -> None:
    with pytest.raises(WireError):
        RunStatus("open", 2)
    with pytest.raises(WireError):
        RunStatus("open", 3, START)
    with pytest.raises(WireError):
        read_run_status(_raw("state", {"phase": "pwned"}), run_id=RUN)


@pytest.mark.parametrize(
    "topic",
    [
        "mqttfl/run/round/²/up/1",  # a Unicode digit
        "mqttfl/run/round/" + "9" * 5000 + "/up/1",
        "mqttfl/run/round/1234567890/up/1",
        "mqttfl/run/round/01/up/1",
        "mqttfl/run/round/1\n/up/1",
        "mqttfl/run/round/-1/up/1",
        "mqttfl/run/round/1/up/a b",
        "mqttfl/run/round/1/up/all",
        "mqttfl/run/round/1/up/" + "x" * 65,
        "mqttfl/run/status/é",
        "mqttfl/run/round/1/start/x",
        "mqttfl/other/state",
        "mqttfl/run/" + "x/" * 400,
    ],
)
def test_a_hostile_topic_is_a_wire_error(topic: str) -> None:
    with pytest.raises(WireError) as info:
        TOPICS.parse(topic)
    assert info.value.reason in ("topic", "bad_id")


def test_topics_of_the_run_parse() -> None:
    assert TOPICS.parse("mqttfl/run/round/12/ack/3") == TOPICS.parse(TOPICS.ack(12, "3"))
    assert TOPICS.parse(TOPICS.down_all(0)) == DownTopic(0, "all")
    assert TOPICS.parse(TOPICS.up(999_999_999, "x")) == UploadTopic(999_999_999, "x")


# --- fuzzing: only WireError leaves a reader -------------------------------------------------
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_ids = st.sampled_from(["0", "3", "coordinator", "all", "x/y", "", "é"])
_keys = {
    "start": ["selected", "timeout_s", "params", "attempt", "uploaded", "announcement"],
    "state": ["phase", "start"],
    "status": ["state", "arch", "classes", "num_samples", "sample_shape", "reason"],
    "metrics": ["accuracy", "f1", "mae", "extra"],
    "ack": ["announcement"],
    "downlink": ["_personal", "p", "weights", "available"],
}
_sane = {
    "selected": st.lists(_ids, max_size=3),
    "uploaded": st.lists(_ids, max_size=3),
    "phase": st.sampled_from(["open", "closed", "finished", "waiting", "x"]),
    "state": st.sampled_from(["online", "offline", "x"]),
    "start": st.fixed_dictionaries(dict.fromkeys(_keys["start"], _tree)),
    "_personal": st.lists(_ids, max_size=3),
}


def _bodies(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(
        st.sampled_from(_keys[kind]),
        st.one_of(_tree, *(s for k, s in _sane.items() if k in _keys[kind])),
        max_size=len(_keys[kind]),
    )


def _envelopes(kind: str) -> st.SearchStrategy[bytes]:
    envelope = st.fixed_dictionaries(
        {
            "v": st.one_of(st.just(1), _leaf),
            "type": st.one_of(st.just(kind), _leaf),
            "run": st.one_of(st.just(RUN), _leaf),
            "round": st.one_of(st.integers(0, 3), _leaf),
            "sender": st.one_of(_ids, _leaf),
            "body": st.one_of(_bodies(kind), _tree),
        }
    )
    packed = envelope.map(lambda e: msgpack.packb(e, use_bin_type=True))
    return st.one_of(packed, st.binary(max_size=64))


READERS: dict[str, Callable[[bytes, int, str], object]] = {
    "start": lambda raw, t, c: read_start(raw, run_id=RUN, round=t),
    "state": lambda raw, t, c: read_run_status(raw, run_id=RUN),
    "status": lambda raw, t, c: read_status(raw, run_id=RUN, client=c),
    "metrics": lambda raw, t, c: read_metrics(raw, run_id=RUN, round=t, client=c),
    "ack": lambda raw, t, c: read_ack(raw, run_id=RUN, round=t, client=c),
    "downlink": lambda raw, t, c: read_downlink(raw, run_id=RUN, round=t, client=c),
}
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_wire_errors(kind: str, raw: bytes, t: int, client: str) -> None:
    try:
        message = READERS[kind](raw, t, client)
    except WireError:
        return
    assert type(message).__name__ in {
        "RoundStart",
        "RunStatus",
        "Online",
        "Offline",
        "Metrics",
        "Ack",
        "Downlink",
    }


@FUZZ
@given(st.data())
def test_fuzz_round_starts(data: st.DataObject) -> None:
    _only_wire_errors("start", data.draw(_envelopes("start")), data.draw(st.integers(0, 3)), "0")


@FUZZ
@given(st.data())
def test_fuzz_run_status(data: st.DataObject) -> None:
    _only_wire_errors("state", data.draw(_envelopes("state")), 0, "0")


@FUZZ
@given(st.data(), _ids)
def test_fuzz_statuses(data: st.DataObject, client: str) -> None:
    _only_wire_errors("status", data.draw(_envelopes("status")), 0, client)


@FUZZ
@given(st.data(), _ids)
def test_fuzz_metrics(data: st.DataObject, client: str) -> None:
    _only_wire_errors(
        "metrics", data.draw(_envelopes("metrics")), data.draw(st.integers(0, 3)), client
    )


@FUZZ
@given(st.data(), _ids)
def test_fuzz_acks(data: st.DataObject, client: str) -> None:
    _only_wire_errors("ack", data.draw(_envelopes("ack")), data.draw(st.integers(0, 3)), client)


@FUZZ
@given(st.data(), st.sampled_from(["all", "0", "3"]))
def test_fuzz_downlinks(data: st.DataObject, client: str) -> None:
    _only_wire_errors(
        "downlink", data.draw(_envelopes("downlink")), data.draw(st.integers(0, 3)), client
    )


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "mqttfl",
                    RUN,
                    "round",
                    "up",
                    "down",
                    "ack",
                    "metrics",
                    "status",
                    "state",
                    "start",
                    "all",
                    "0",
                    "12",
                    "+",
                    "#",
                    "",
                ]
            ),
            st.text(max_size=10),
        ),
        max_size=7,
    )
)
def test_fuzz_topics(levels: list[str]) -> None:
    try:
        where = TOPICS.parse("/".join(levels))
    except WireError:
        return
    match where:
        case StartTopic(t) | DownTopic(t, _) | AckTopic(t, _) | UploadTopic(t, _):
            assert 0 <= t <= MAX_ROUND
        case MetricsTopic(t, _):
            assert 0 <= t <= MAX_ROUND
