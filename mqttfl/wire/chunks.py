"""Chunks: a message larger than a broker's packet limit, split and put back together.

Managed brokers cap a publish (AWS IoT Core 128 KB, Azure IoT Hub 256 KB, EMQX 1 MB by
default); a FedAvg upload of LargeConvNet4 is 1.86 MB. With ``broker.max_message_bytes``
set, the bus splits any larger payload into chunks, each its own MQTT message on the same
topic, and the receiving bus reassembles them before anything decodes the payload.

A chunk is a fixed header and a slice of the payload::

    magic "MQFC" | version 1 | message id (8) | index (2) | count (2) | total (4) | BLAKE2b-128 of the whole payload (16)

A msgpack envelope is a map, so its first byte is 0x80-0x8f, 0xde or 0xdf and never
``M`` (0x4d): unchunked messages pass through unchanged.

The receiver keeps at most one partial message per topic. It reserves a message's
declared size when its first chunk arrives, within two bounds: one per sender (a sender
that starts more than it may hold loses its own oldest partial messages, never anyone
else's) and one in all (sized by the receiver from what a round can legitimately bring;
a message that does not fit is refused whole, and what is already admitted always fits,
so no sender can push out another's message). Partial messages idle for too long are
dropped. Nothing half-arrived is ever returned; every message that will not complete is
reported once (a WireError, or its key in :attr:`Reassembler.evicted`) so that its
sender can be asked to send it again, and counted per sender. Reasons:
``chunk_malformed``, ``chunk_index``, ``chunk_mismatch``, ``chunk_duplicate``,
``chunk_incomplete``, ``chunk_checksum``, ``chunk_busy``, ``oversize``.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
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
# A partial message without a new chunk for this long will not complete: its sender died
# or moved on. Dropping it frees its reservation.
MAX_IDLE_S = 120.0
REFUSED_MEMORY = 4096  # refused messages remembered, so their later chunks drop quietly


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


def message_id_of(chunk: bytes) -> int | None:
    """The message id a chunk's header names (None for anything shorter than a header)."""
    if len(chunk) < HEADER_BYTES or not is_chunk(chunk):
        return None
    return int(_HEADER.unpack_from(chunk)[2])


@dataclass
class _Partial:
    message_id: int
    sender: str
    count: int
    total: int
    digest: bytes
    touched: float
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


def _whole_key(key: str) -> str:
    return key


@dataclass
class Reassembler:
    """Puts chunked messages back together, one partial message per key (topic).

    ``sender_of`` maps a key to its sender (the coordinator passes the topic's client
    level); each sender holds at most ``max_sender_bytes`` of partial messages, and all
    of them together at most ``max_buffered_bytes`` (the owner resizes it as rounds
    change, see :meth:`resize`). With ``expected`` set (the round's selected clients),
    the others (late or hostile senders) share one message's room of their own, so they
    cannot take the room the round's uploads need.
    """

    max_message_bytes: int  # the largest whole message this receiver takes
    max_buffered_bytes: int = 0  # in all partial messages; 0: four largest messages
    max_sender_bytes: int = 0  # in one sender's partial messages; 0: one largest message
    sender_of: Callable[[str], str] = _whole_key
    max_idle_s: float = MAX_IDLE_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.partials: OrderedDict[str, _Partial] = OrderedDict()
        # (key, message id) of partial messages that will not complete
        self.evicted: list[tuple[str, int]] = []
        self.expected: frozenset[str] | None = None
        self.refused: Counter[str] = Counter()  # messages refused whole, per sender
        self.dropped: Counter[str] = Counter()  # partial messages given up on, per sender
        self._refused_ids: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._reserved: Counter[str] = Counter()
        self.reserved = 0
        if self.max_buffered_bytes <= 0:
            self.max_buffered_bytes = 4 * self.max_message_bytes
        if self.max_sender_bytes <= 0:
            self.max_sender_bytes = self.max_message_bytes

    @property
    def buffered(self) -> int:
        return sum(p.size for p in self.partials.values())

    def reserved_by(self, sender: str) -> int:
        """The bytes reserved for ``sender``'s partial messages (at most max_sender_bytes)."""
        return self._reserved[sender]

    def resize(
        self, *, buffered: int, per_sender: int, expected: frozenset[str] | None = None
    ) -> None:
        """New bounds and expected senders (what admitted messages hold stays theirs)."""
        self.max_buffered_bytes = max(buffered, 1)
        self.max_sender_bytes = max(min(per_sender, self.max_message_bytes), 1)
        self.expected = expected

    def feed(self, key: str, data: bytes) -> tuple[bytes, int] | None:
        """The whole payload and the bytes its chunks took, once the last chunk is in;
        None while it is still partial (or refused already). WireError for a chunk that
        cannot belong, or for the first chunk of a message that does not fit."""
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
        now = self.clock()
        self._expire(now)
        if (key, message_id) in self._refused_ids:
            return None  # the rest of a message refused whole (its sender was told once)
        body = data[HEADER_BYTES:]
        partial = self.partials.get(key)
        if partial is not None and partial.message_id != message_id:
            self._drop(key)  # its sender moved on: it will never complete
        partial = self.partials.get(key)
        if partial is None:
            partial = self._admit(key, message_id, count, total, digest, now)
        elif (partial.count, partial.total, partial.digest) != (count, total, digest):
            raise WireError("chunk_mismatch", f"chunk {index} disagrees with its message's header")
        if index in partial.parts:
            raise WireError("chunk_duplicate", f"chunk {index} of message {message_id:x} again")
        if partial.size + len(body) > total:
            self._release(key)
            raise WireError("chunk_mismatch", f"chunks carry more than the declared {total} bytes")
        partial.parts[index] = body
        partial.size += len(body)
        partial.touched = now
        self.partials.move_to_end(key)
        if len(partial.parts) < count:
            return None
        self._release(key)
        payload = b"".join(partial.parts[i] for i in range(count))
        if len(payload) != total or _digest(payload) != digest:
            raise WireError("chunk_checksum", f"message {message_id:x} does not match its digest")
        return payload, total + count * HEADER_BYTES

    def _admit(
        self, key: str, message_id: int, count: int, total: int, digest: bytes, now: float
    ) -> _Partial:
        """Reserve a new message's declared size, or refuse it whole (WireError)."""
        sender = self.sender_of(key)
        if total > self.max_sender_bytes:
            self._refuse(key, message_id, sender)
            raise WireError(
                "oversize", f"a chunked message of {total} bytes exceeds {self.max_sender_bytes}"
            )
        while self._reserved[sender] + total > self.max_sender_bytes:
            oldest = next(k for k, p in self.partials.items() if p.sender == sender)
            self._drop(oldest)  # a sender makes room only at its own expense
        taken, room = self.reserved, self.max_buffered_bytes
        if self.expected is not None:  # the expected senders' room, or the others'
            inside = sender in self.expected
            taken = sum(n for s, n in self._reserved.items() if (s in self.expected) == inside)
            room = self.max_buffered_bytes if inside else self.max_sender_bytes
        if taken + total > room:
            self._refuse(key, message_id, sender)
            raise WireError(
                "chunk_busy",
                f"{taken} of {room} bytes of partial messages are taken: no room for {total} more",
            )
        partial = _Partial(message_id, sender, count, total, digest, now)
        self.partials[key] = partial
        self._reserved[sender] += total
        self.reserved += total
        return partial

    def _refuse(self, key: str, message_id: int, sender: str) -> None:
        self.refused[sender] += 1
        self._refused_ids[(key, message_id)] = None
        while len(self._refused_ids) > REFUSED_MEMORY:
            self._refused_ids.popitem(last=False)

    def _release(self, key: str) -> _Partial:
        partial = self.partials.pop(key)
        self._reserved[partial.sender] -= partial.total
        if not self._reserved[partial.sender]:
            del self._reserved[partial.sender]
        self.reserved -= partial.total
        return partial

    def _drop(self, key: str) -> None:
        """Give up on a partial message: free its room and report its key."""
        partial = self._release(key)
        self.dropped[partial.sender] += 1
        self.evicted.append((key, partial.message_id))

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self.partials.items() if now - p.touched > self.max_idle_s]:
            self._drop(key)
