"""Topic kinds are a tagged union: every topic the run builds parses back to its own class
with its own levels, a foreign or hostile one is refused as before, and each reader takes
the kinds it reads and refuses the others by name. The sensor's ``--input`` is one too."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttfl.bus.transport import Incoming
from mqttfl.config import RunConfig
from mqttfl.engine.budget import UNNAMED
from mqttfl.errors import UsageError, WireError
from mqttfl.monitor.view import FederationView
from mqttfl.nodes.client_inbox import read_for_client
from mqttfl.nodes.screen import LEASE, sender_of
from mqttfl.sensing.source import CaptureSource, MqttSource, ShardSource, parse_source
from mqttfl.wire import BROADCAST, Topics
from mqttfl.wire.control import Ack
from mqttfl.wire.lease import Lease
from mqttfl.wire.topics import (
    MAX_ROUND,
    AckTopic,
    DownTopic,
    LeaseTopic,
    ManifestTopic,
    MetricsTopic,
    SiteTopic,
    StartTopic,
    StateTopic,
    StatusTopic,
    TopicInfo,
    UploadTopic,
)

RUN = "union-run"
TOPICS = Topics(RUN)
KINDS = typing.get_args(TopicInfo)


def rebuild(topics: Topics, where: TopicInfo) -> str:
    """The topic a parsed one came from, by the run's own builders (one case per kind)."""
    match where:
        case StartTopic(t):
            return topics.start(t)
        case DownTopic(t, client):
            return topics.down(t, client)
        case AckTopic(t, client):
            return topics.ack(t, client)
        case UploadTopic(t, client):
            return topics.up(t, client)
        case MetricsTopic(t, client):
            return topics.metrics(t, client)
        case StatusTopic(client):
            return topics.status(client)
        case StateTopic():
            return topics.state
        case SiteTopic(site):
            return topics.site(site)
        case LeaseTopic():
            return topics.lease
        case ManifestTopic():
            return topics.manifest


BUILT: list[tuple[str, TopicInfo]] = [
    (TOPICS.start(0), StartTopic(0)),
    (TOPICS.start(MAX_ROUND), StartTopic(MAX_ROUND)),
    (TOPICS.down(3, "c-1"), DownTopic(3, "c-1")),
    (TOPICS.down_all(3), DownTopic(3, BROADCAST)),
    (TOPICS.ack(4, "7"), AckTopic(4, "7")),
    (TOPICS.up(5, "dev.a_b"), UploadTopic(5, "dev.a_b")),
    (TOPICS.metrics(6, "12"), MetricsTopic(6, "12")),
    (TOPICS.status("3"), StatusTopic("3")),
    (TOPICS.state, StateTopic()),
    (TOPICS.site("kitchen"), SiteTopic("kitchen")),
    (TOPICS.lease, LeaseTopic()),
    (TOPICS.manifest, ManifestTopic()),
]


def test_the_union_is_ten_frozen_kinds_each_named_by_its_level() -> None:
    assert len(KINDS) == 10
    assert {type(where) for _, where in BUILT} == set(KINDS)
    assert len({kind.kind for kind in KINDS}) == 10
    for topic, where in BUILT:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(where, "kind", "up")  # noqa: B010
        assert where.kind in topic.split("/")


@pytest.mark.parametrize(("topic", "expected"), BUILT, ids=[t for t, _ in BUILT])
def test_every_built_topic_parses_to_its_class_and_fields(topic: str, expected: TopicInfo) -> None:
    where = TOPICS.parse(topic)
    assert type(where) is type(expected)
    assert where == expected
    assert rebuild(TOPICS, where) == topic


def test_the_broadcast_downlink_is_a_down_topic_that_says_so() -> None:
    broadcast = TOPICS.parse(TOPICS.down_all(1))
    personal = TOPICS.parse(TOPICS.down(1, "3"))
    assert isinstance(broadcast, DownTopic)
    assert isinstance(personal, DownTopic)
    assert broadcast.broadcast
    assert not personal.broadcast


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("mqttfl/other-run/state", "topic"),
        ("mqttfl/union-run", "topic"),
        ("mqttfl/union-run/", "topic"),
        ("mqttfl/union-run/state/x", "topic"),
        ("mqttfl/union-run/lease/x", "topic"),
        ("mqttfl/union-run/manifest/x", "topic"),
        ("mqttfl/union-run/status", "topic"),
        ("mqttfl/union-run/status/all", "bad_id"),
        ("mqttfl/union-run/status/a+b", "bad_id"),
        ("mqttfl/union-run/site/all", "bad_id"),
        ("mqttfl/union-run/site/#", "bad_id"),
        ("mqttfl/union-run/round/1", "topic"),
        ("mqttfl/union-run/round/1/down", "topic"),
        ("mqttfl/union-run/round/1/up/all", "bad_id"),
        ("mqttfl/union-run/round/1/ack/all", "bad_id"),
        ("mqttfl/union-run/round/1/metrics/a/b", "topic"),
        ("mqttfl/union-run/round/1/sideways/3", "topic"),
        ("mqttfl/union-run/round/01/start", "topic"),
        ("mqttfl/union-run/round/1000000000/start", "topic"),
        ("mqttfl/union-run/round/٣/start", "topic"),  # an Arabic-Indic digit
        ("mqttfl/union-run/round/1/start/x", "topic"),
        ("mqttfl/union-run/" + "round/1/" * 80, "topic"),
    ],
)
def test_a_foreign_or_hostile_topic_is_still_refused(topic: str, reason: str) -> None:
    with pytest.raises(WireError) as info:
        TOPICS.parse(topic)
    assert info.value.reason == reason


LEVELS = [
    *("round", "up", "down", "ack", "metrics", "status", "state", "start", "site", "lease"),
    "manifest",
]


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([*LEVELS, "all", "0", "7", "01", "x", "+", "#", ""]),
            st.text(max_size=6),
        ),
        max_size=5,
    )
)
def test_whatever_parses_is_rebuilt_exactly(levels: list[str]) -> None:
    topic = "/".join([TOPICS.base, *levels])
    refused: str | None = None
    try:
        where = TOPICS.parse(topic)
    except WireError as exc:
        refused = exc.reason
    else:
        assert rebuild(TOPICS, where) == topic
    assert refused in (None, "topic", "bad_id")


def test_who_a_topic_is_charged_to() -> None:
    assert sender_of(SiteTopic("kitchen")) == "site/kitchen"
    assert sender_of(LeaseTopic()) == LEASE
    assert sender_of(StartTopic(1)) == sender_of(StateTopic()) == UNNAMED
    assert sender_of(ManifestTopic()) == UNNAMED
    for where in (
        StatusTopic("3"),
        DownTopic(1, "3"),
        AckTopic(1, "3"),
        UploadTopic(1, "3"),
        MetricsTopic(1, "3"),
    ):
        assert sender_of(where) == "3"


def _inbox(topic: str, payload: bytes = b"x") -> object:
    return read_for_client(
        Incoming(topic, payload),
        config=RunConfig(run_id=RUN),
        client_id="3",
        method=None,  # type: ignore[arg-type]  # no downlink reaches the method here
    )


@pytest.mark.parametrize(
    ("topic", "kind"),
    [
        (TOPICS.ack(1, "3"), "ack"),
        (TOPICS.up(1, "3"), "up"),
        (TOPICS.metrics(1, "3"), "metrics"),
        (TOPICS.site("kitchen"), "site"),
        (TOPICS.manifest, "manifest"),  # read before the runner starts (nodes/manifest.py)
    ],
)
def test_a_client_refuses_the_kinds_it_does_not_take_by_name(topic: str, kind: str) -> None:
    with pytest.raises(WireError, match=f"a client does not take {kind} messages"):
        _inbox(topic)


def test_a_client_reads_the_runs_lease_to_know_its_coordinator_is_live() -> None:
    assert _inbox(TOPICS.lease, Lease(True, "host", 7, 1.0).encode()) == Lease(True, "host", 7, 1.0)
    with pytest.raises(WireError):
        _inbox(TOPICS.lease, b"anything")


def test_a_client_ignores_another_clients_status_and_refuses_its_downlink() -> None:
    assert _inbox(TOPICS.status("4")) is None
    assert _inbox(TOPICS.status("3"), b"") is None  # a cleared retained status
    with pytest.raises(WireError, match="a downlink for '4' reached '3'"):
        _inbox(TOPICS.down(1, "4"))


def test_the_watcher_reads_its_kinds_and_names_the_others() -> None:
    view = FederationView(RUN)
    assert view.apply(TOPICS.site("kitchen"), b"\x01", 0.0) == ["rejected site/kitchen: topic"]
    assert view.apply(TOPICS.down_all(1), b"x", 0.0) == ["rejected round/1/down/all: topic"]
    assert view.apply(TOPICS.lease, b"anything", 0.0) == []
    assert view.apply(TOPICS.manifest, b"anything", 0.0) == []
    assert view.apply(TOPICS.state, b"", 0.0) == []
    ack = Ack(1, "3", 0).encode(RUN)
    assert view.apply(TOPICS.ack(1, "3"), ack, 0.0) == []
    assert view.acks[1]["3"] == 1
    assert view.rejected["topic"] == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mqtt:csi/gateway", MqttSource("csi/gateway")),
        ("mqtt:a:b", MqttSource("a:b")),
        ("shard:/tmp/client_0.npz", ShardSource("/tmp/client_0.npz")),
        ("shard:", ShardSource("")),
        ("capture.npz", CaptureSource("capture.npz")),
        ("c:/captures/x.dat", CaptureSource("c:/captures/x.dat")),
        ("MQTT:topic", CaptureSource("MQTT:topic")),
    ],
)
def test_a_sensor_input_is_one_kind_of_source(text: str, expected: object) -> None:
    source = parse_source(text)
    assert source == expected
    assert type(source) is type(expected)


@pytest.mark.parametrize("topic", ["", "a/#", "a/+/b", "a\0b", "a\nb", "x" * 65_536])
def test_a_gateway_topic_that_cannot_be_subscribed_is_a_usage_error(topic: str) -> None:
    with pytest.raises(UsageError, match="name one topic after mqtt:"):
        parse_source(f"mqtt:{topic}")
