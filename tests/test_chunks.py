"""Messages above a broker's packet limit travel in chunks, and come back whole or not at all."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttfl.config import load_config
from mqttfl.errors import ConfigError, WireError
from mqttfl.provisioning.local_broker import LOCAL_CONF, LocalBroker
from mqttfl.wire.chunks import (
    HEADER_BYTES,
    Reassembler,
    framed_size,
    is_chunk,
    message_id_of,
    payload_budget,
    split,
)
from tests.faults import Federation

PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes


def _reassemble(chunks: list[bytes], reassembler: Reassembler | None = None) -> tuple[bytes, int]:
    reassembler = reassembler or Reassembler(1_000_000)
    done = None
    for chunk in chunks:
        done = reassembler.feed("t", chunk)
    assert done is not None
    return done


@pytest.mark.parametrize("size", [0, 1, 999, 1000])
def test_a_payload_that_fits_is_sent_as_it_is(size: int) -> None:
    payload = PAYLOAD[:size]
    assert split(payload, 1000) == [payload]
    assert framed_size(size, 1000) == size


@pytest.mark.parametrize("size", [1001, 2000, 10_240])
def test_a_larger_payload_round_trips_through_its_chunks(size: int) -> None:
    payload = PAYLOAD[:size]
    chunks = split(payload, 1000)
    assert len(chunks) >= 2
    assert all(len(c) <= 1000 and is_chunk(c) for c in chunks)
    whole, wire = _reassemble(chunks)
    assert whole == payload
    assert wire == sum(len(c) for c in chunks) == framed_size(size, 1000)


def test_chunks_may_arrive_in_any_order() -> None:
    chunks = split(PAYLOAD, 1000)
    assert _reassemble(list(reversed(chunks)))[0] == PAYLOAD


def _reason(chunks: list[bytes], reassembler: Reassembler | None = None) -> str:
    reassembler = reassembler or Reassembler(1_000_000)

    def feed_all() -> None:
        for chunk in chunks:
            reassembler.feed("t", chunk)

    with pytest.raises(WireError) as info:
        feed_all()
    return info.value.reason


def test_every_broken_chunk_stream_is_refused_with_its_reason() -> None:
    chunks = split(PAYLOAD, 1000)
    tampered = bytearray(chunks[1])
    tampered[-1] ^= 0xFF
    header = bytearray(chunks[0])
    header[14] = 0xFF  # index high byte: beyond the count
    assert _reason([chunks[0], chunks[0]]) == "chunk_duplicate"
    assert _reason([chunks[0], bytes(tampered), *chunks[2:]]) == "chunk_checksum"
    assert _reason([bytes(header)]) == "chunk_index"
    assert _reason([chunks[0][: HEADER_BYTES - 1]]) == "chunk_malformed"
    assert _reason(chunks, Reassembler(5000)) == "oversize"
    # Nothing half-arrived is ever returned: a missing chunk leaves only a partial behind.
    reassembler = Reassembler(1_000_000)
    assert all(reassembler.feed("t", c) is None for c in chunks[:-1])


def test_a_new_message_on_a_topic_reports_the_one_it_replaces() -> None:
    chunks, other = split(PAYLOAD, 1000), split(PAYLOAD[::-1], 1000)
    reassembler = Reassembler(1_000_000)
    assert reassembler.feed("t", chunks[0]) is None
    assert reassembler.feed("t", other[0]) is None  # its sender moved on
    assert reassembler.evicted == [("t", message_id_of(chunks[0]))]
    assert reassembler.dropped["t"] == 1
    assert _reassemble(other[1:], reassembler)[0] == PAYLOAD[::-1]  # the new one completes


def _sender(key: str) -> str:
    return key.rpartition("/")[2]


def test_a_full_buffer_refuses_new_messages_whole_and_never_evicts_admitted_ones() -> None:
    big = split(PAYLOAD * 2, 4000)  # 20,480 bytes in 6 chunks
    reassembler = Reassembler(100_000, max_buffered_bytes=45_000, sender_of=_sender)
    for honest in ("a", "b"):
        assert reassembler.feed(f"up/1/{honest}", big[0]) is None
    with pytest.raises(WireError) as info:  # no room: refused at its first chunk, and counted
        reassembler.feed("up/1/c", big[0])
    assert info.value.reason == "chunk_busy"
    assert reassembler.refused["c"] == 1
    assert all(reassembler.feed("up/1/c", part) is None for part in big[1:])  # told once
    assert reassembler.reserved <= 45_000
    assert not reassembler.evicted
    for honest in ("a", "b"):
        done = [reassembler.feed(f"up/1/{honest}", part) for part in big[1:]]
        assert done[-1] is not None
        assert done[-1][0] == PAYLOAD * 2
    resent = split(PAYLOAD * 2, 4000)  # c sends again (a new message id): room now
    assert _reassemble(resent, reassembler)[0] == PAYLOAD * 2


def test_a_flooding_sender_is_bounded_and_counted_and_evicts_only_itself() -> None:
    reassembler = Reassembler(
        100_000, max_buffered_bytes=70_000, max_sender_bytes=21_000, sender_of=_sender
    )
    honest = {c: split(PAYLOAD * 2, 4000) for c in ("a", "b")}
    for client, parts in honest.items():
        reassembler.feed(f"up/1/{client}", parts[0])
    for index in range(200):  # a flood of first chunks on topics of its own
        reassembler.feed(f"round/{index}/up/flood", split(PAYLOAD * 2, 4000)[0])
        assert reassembler.reserved <= 70_000
        assert reassembler.reserved_by("flood") <= 21_000
    assert reassembler.dropped["flood"] == 199
    assert set(reassembler.dropped) == {"flood"}
    assert all(key.endswith("/flood") for key, _ in reassembler.evicted)
    for client, parts in honest.items():  # the honest messages were never touched
        done = [reassembler.feed(f"up/1/{client}", part) for part in parts[1:]]
        assert done[-1] is not None
        assert done[-1][0] == PAYLOAD * 2
    with pytest.raises(WireError, match="exceeds 21000"):  # more than a sender may hold
        reassembler.feed("up/2/flood", split(PAYLOAD * 3, 4000)[0])
    assert reassembler.refused["flood"] == 1


def test_senders_outside_the_round_cannot_take_the_rounds_room() -> None:
    reassembler = Reassembler(100_000, max_buffered_bytes=41_000, sender_of=_sender)
    reassembler.resize(buffered=41_000, per_sender=21_000, expected=frozenset({"a", "b"}))
    reassembler.feed("up/1/late", split(PAYLOAD * 2, 4000)[0])  # one outsider fits its room
    with pytest.raises(WireError, match="no room"):  # a second outsider does not
        reassembler.feed("up/1/flood", split(PAYLOAD * 2, 4000)[0])
    for client in ("a", "b"):  # the round's two uploads still fit, whole
        parts = split(PAYLOAD * 2, 4000)
        done = [reassembler.feed(f"up/1/{client}", part) for part in parts]
        assert done[-1] is not None
    assert reassembler.refused == {"flood": 1}


def test_an_idle_partial_message_is_given_up_on_and_reported() -> None:
    now = [0.0]
    reassembler = Reassembler(100_000, max_idle_s=60.0, clock=lambda: now[0])
    parts = split(PAYLOAD, 1000)
    reassembler.feed("up/1/a", parts[0])
    now[0] = 61.0
    reassembler.feed("up/1/b", parts[0])  # any chunk lets the receiver look at the others
    assert [key for key, _ in reassembler.evicted] == ["up/1/a"]
    assert reassembler.reserved == len(PAYLOAD)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=6), st.integers(0, 3))
def test_fuzz_only_wire_errors_leave_the_reassembler(frames: list[bytes], seed: int) -> None:
    real = split(PAYLOAD[: 600 + seed * 300], 300)
    reassembler = Reassembler(100_000)
    for frame in [*frames, *real[: seed + 1], *(b"MQFC" + f for f in frames)]:
        with contextlib.suppress(WireError):
            reassembler.feed("t", frame)


def test_a_packet_limit_below_4096_names_its_key() -> None:
    with pytest.raises(ConfigError, match=re.escape("broker.max_message_bytes")):
        load_config("configs/fedapa-csi.toml", ["broker.max_message_bytes=1000"])


@pytest.mark.slow
def test_fedavg_with_large_convnet4_through_a_128_kib_packet_limit(tmp_path: Path) -> None:
    limit = 131_072
    conf = LOCAL_CONF.replace("max_packet_size 67108864", f"max_packet_size {limit}")
    assert f"max_packet_size {limit}" in conf
    overrides = ["method=fedavg", "model.name=large", f"broker.max_message_bytes={limit}"]
    with (
        LocalBroker(tmp_path / "broker", conf=conf) as broker,
        Federation(tmp_path / "fed", broker, clients=2, rounds=2, overrides=overrides) as fed,
    ):
        fed.start()
        summary = fed.finish(timeout=300)
    assert summary["rounds_completed"] == 2
    assert summary["rejections"] == {}
    comm = summary["comm"]
    upload = comm["up_bytes_per_client_round"]
    budget = payload_budget(limit, "mqttfl/fedapa-csi/round/1/up/0")
    raw = next(
        n
        for n in range(int(upload) - 70_000, int(upload) + 1)
        if framed_size(n, budget) == int(upload)
    )
    overhead = upload / raw - 1
    assert upload > 1_800_000
    assert 0 < overhead < 0.001
    print(
        "FIGURES chunks",
        json.dumps(
            {
                "packet_limit": limit,
                "upload_bytes_on_wire": upload,
                "upload_bytes": raw,
                "framing_overhead_pct": round(100 * overhead, 4),
                "down_bytes_per_client_round": comm["down_bytes_per_client_round"],
            }
        ),
    )
