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
    other = split(PAYLOAD[::-1], 1000)
    tampered = bytearray(chunks[1])
    tampered[-1] ^= 0xFF
    header = bytearray(chunks[0])
    header[14] = 0xFF  # index high byte: beyond the count
    assert _reason([chunks[0], chunks[0]]) == "chunk_duplicate"
    assert _reason([chunks[0], other[1]]) == "chunk_incomplete"  # another message's chunk
    assert _reason([chunks[0], bytes(tampered), *chunks[2:]]) == "chunk_checksum"
    assert _reason([bytes(header)]) == "chunk_index"
    assert _reason([chunks[0][: HEADER_BYTES - 1]]) == "chunk_malformed"
    assert _reason(chunks, Reassembler(5000)) == "oversize"
    # Nothing half-arrived is ever returned: a missing chunk leaves only a partial behind.
    reassembler = Reassembler(1_000_000)
    assert all(reassembler.feed("t", c) is None for c in chunks[:-1])


def test_partial_messages_stay_within_their_bound() -> None:
    reassembler = Reassembler(100_000, max_buffered_bytes=30_000)
    for index in range(50):  # a flood of first chunks, each a new message on its own topic
        reassembler.feed(f"t{index}", split(PAYLOAD * 2, 4000)[0])
        assert reassembler.buffered <= 30_000
    assert reassembler.evicted  # the oldest were pushed out, and said so


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
