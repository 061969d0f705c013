"""Chunks: a message larger than a broker's packet limit, split and put back together.

Managed brokers cap a publish (AWS IoT Core 128 KB, Azure IoT Hub 256 KB, EMQX 1 MB by
default); a FedAvg upload of LargeConvNet4 is 1.86 MB. With ``broker.max_message_bytes``
set, the bus splits any larger payload into chunks, each its own MQTT message on the same
topic, and the receiving bus reassembles them before anything decodes the payload.

A chunk is a fixed header and a slice of the payload::

    magic "MQFC" | version 1 | message id (8) | index (2) | count (2) | total (4) | BLAKE2b-128 of the whole payload (16)

A msgpack envelope is a map, so its first byte is 0x80-0x8f, 0xde or 0xdf and never
``M`` (0x4d): unchunked messages pass through unchanged. The receiver keeps at most one
partial message per topic and a bounded number of bytes in all; nothing half-arrived
is ever returned, and every refusal is a :class:`~mqttfl.errors.WireError` with a reason
(``chunk_malformed``, ``chunk_index``, ``chunk_mismatch``, ``chunk_duplicate``,
``chunk_incomplete``, ``chunk_checksum``, ``oversize``).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from collections import OrderedDict
from dataclasses import dataclass, field

from mqttfl.errors import WireError

MAGIC = b"MQFC"
VERSION = 1
_HEADER = struct.Struct(">4sBQHHI16s")
HEADER_BYTES = _HEADER.size  # 37
MAX_CHUNKS = 65_535
# An MQTT PUBLISH adds a fixed header (<= 5 bytes), the topic's length field (2) and a
# packet id (2) to the topic and payload: this leaves room for all of them.
PACKET_OVERHEAD = 16


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def payload_budget(limit: int, topic: str) -> int:
    """How many payload bytes fit in one packet of ``limit`` bytes on ``topic``."""
    return limit - len(topic.encode()) - PACKET_OVERHEAD


def split(payload: bytes, budget: int) -> list[bytes]:
    """The payload itself if it fits in ``budget`` bytes, else its chunks."""
    if len(payload) <= budget:
        return [payload]
    size = budget - HEADER_BYTES
    if size <= 0:
        raise ValueError(f"a budget of {budget} bytes leaves no room after the chunk header")
    count = math.ceil(len(payload) / size)
    if count > MAX_CHUNKS or len(payload) >= 2**32:
        raise ValueError(f"{len(payload)} bytes would need {count} chunks of {size}")
    message_id = secrets.randbits(64)
    digest = _digest(payload)
    return [
        _HEADER.pack(MAGIC, VERSION, message_id, index, count, len(payload), digest)
        + payload[index * size : (index + 1) * size]
        for index in range(count)
    ]


def framed_size(n: int, budget: int) -> int:
    """Bytes a payload of ``n`` bytes takes on the wire once split for ``budget``."""
    if budget <= 0 or n <= budget:
        return n
    size = budget - HEADER_BYTES
    return n + math.ceil(n / size) * HEADER_BYTES


def is_chunk(payload: bytes) -> bool:
    return payload[:4] == MAGIC


@dataclass
class _Partial:
    message_id: int
    count: int
    total: int
    digest: bytes
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


@dataclass
class Reassembler:
    """Puts chunked messages back together, one partial message per key (topic)."""

    max_message_bytes: int  # the largest whole message this receiver takes
    max_buffered_bytes: int = 0  # in all partial messages; 0: four largest messages

    def __post_init__(self) -> None:
        self.partials: OrderedDict[str, _Partial] = OrderedDict()
        self.evicted: list[str] = []  # keys whose partial message the bound pushed out
        if self.max_buffered_bytes <= 0:
            self.max_buffered_bytes = 4 * self.max_message_bytes

    @property
    def buffered(self) -> int:
        return sum(p.size for p in self.partials.values())

    def feed(self, key: str, data: bytes) -> tuple[bytes, int] | None:
        """The whole payload and the bytes its chunks took, once the last chunk is in;
        None while it is still partial. WireError for a chunk that cannot belong."""
        if len(data) < HEADER_BYTES:
            raise WireError("chunk_malformed", f"a chunk of {len(data)} bytes has no full header")
        magic, version, message_id, index, count, total, digest = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise WireError("chunk_malformed", f"unknown chunk version {version}")
        if not 2 <= count <= MAX_CHUNKS or index >= count:
            raise WireError("chunk_index", f"chunk {index} of {count}")
        if total > self.max_message_bytes:
            raise WireError(
                "oversize", f"a chunked message of {total} bytes exceeds {self.max_message_bytes}"
            )
        body = data[HEADER_BYTES:]
        partial = self.partials.get(key)
        if partial is not None and partial.message_id != message_id:
            del self.partials[key]  # its sender moved on: it will never complete
            raise WireError(
                "chunk_incomplete",
                f"message {partial.message_id:x} on {key[:80]} lost {partial.count - len(partial.parts)} "
                "chunks to a new message",
            )
        if partial is None:
            partial = _Partial(message_id, count, total, digest)
            self.partials[key] = partial
        elif (partial.count, partial.total, partial.digest) != (count, total, digest):
            raise WireError("chunk_mismatch", f"chunk {index} disagrees with its message's header")
        if index in partial.parts:
            raise WireError("chunk_duplicate", f"chunk {index} of message {message_id:x} again")
        if partial.size + len(body) > total:
            del self.partials[key]
            raise WireError("chunk_mismatch", f"chunks carry more than the declared {total} bytes")
        partial.parts[index] = body
        partial.size += len(body)
        self.partials.move_to_end(key)
        self._bound(keep=key)
        if len(partial.parts) < count:
            return None
        del self.partials[key]
        payload = b"".join(partial.parts[i] for i in range(count))
        if len(payload) != total or _digest(payload) != digest:
            raise WireError("chunk_checksum", f"message {message_id:x} does not match its digest")
        return payload, total + count * HEADER_BYTES

    def _bound(self, *, keep: str) -> None:
        """Evict the oldest partial messages while more than the bound is buffered."""
        while self.buffered > self.max_buffered_bytes and len(self.partials) > 1:
            oldest = next(k for k in self.partials if k != keep)
            del self.partials[oldest]
            self.evicted.append(oldest)
        if self.buffered > self.max_buffered_bytes:
            del self.partials[keep]
            self.evicted.append(keep)
            raise WireError(
                "oversize", f"more than {self.max_buffered_bytes} bytes of partial messages"
            )
