"""msgpack codec: a typed envelope, with numpy arrays as raw little-endian bytes.

Every message carries schema version, type, run, round and sender. An array travels as
a msgpack extension holding ``[dtype, shape, bytes]``; never pickle, never ``.tolist()``.
Decoding validates the envelope and every array once; the declared shape must match the
bytes actually present, so a tiny message cannot make the decoder allocate a huge array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import numpy as np

from mqttfl.errors import WireError

SCHEMA_VERSION = 1
ARRAY_EXT = 1
MESSAGE_TYPES = frozenset(
    {"status", "start", "ack", "upload", "downlink", "metrics", "state", "resend", "manifest"}
)
# Only plain numeric dtypes cross the wire; object arrays could smuggle anything.
ALLOWED_DTYPES = frozenset({"<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<i4", "<i8", "|b1"})
MAX_NDIM = 8
_ENVELOPE_KEYS = frozenset({"v", "type", "run", "round", "sender", "body"})


@dataclass(frozen=True)
class Message:
    type: str
    run: str
    round: int
    sender: str
    body: dict[str, Any] = field(default_factory=dict)
    version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or self.type not in MESSAGE_TYPES:
            raise WireError("type", f"unknown message type {str(self.type)[:40]!r}")
        if isinstance(self.version, bool) or self.version != SCHEMA_VERSION:
            raise WireError(
                "version", f"schema version {str(self.version)[:20]!r} is not {SCHEMA_VERSION}"
            )
        if not isinstance(self.run, str) or not isinstance(self.sender, str):
            raise WireError("envelope", "run and sender must be strings")
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise WireError("envelope", f"round must be a non-negative integer, got {self.round!r}")
        if not isinstance(self.body, dict):
            raise WireError("envelope", "body must be a map")


def _pack_array(array: np.ndarray) -> msgpack.ExtType:
    if array.dtype.kind not in "fiub":
        raise WireError("dtype", f"cannot send arrays of dtype {array.dtype}")
    wire = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    # The array's own buffer, not a tobytes() copy: msgpack packs it as bin all the same.
    data = wire.data.cast("B") if wire.size else b""
    return msgpack.ExtType(ARRAY_EXT, msgpack.packb([wire.dtype.str, list(wire.shape), data]))


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise WireError("type", f"cannot encode {type(obj).__name__}")


def _unpack_array(code: int, data: bytes) -> np.ndarray:
    if code != ARRAY_EXT:
        raise WireError("malformed", f"unknown msgpack extension {code}")
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError("malformed", f"bad array header: {exc}") from None
    if not (isinstance(header, list) and len(header) == 3):
        raise WireError("malformed", "array must be [dtype, shape, bytes]")
    dtype_str, shape, payload = header
    if dtype_str not in ALLOWED_DTYPES:
        raise WireError("dtype", f"dtype {dtype_str!r} is not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise WireError("shape", f"bad array shape {shape!r}")
    if not isinstance(payload, bytes):
        raise WireError("malformed", "array data must be bytes")
    dtype = np.dtype(dtype_str)
    # numpy refuses a shape whose non-zero sides span more than it can address, even when
    # another side is 0 and the array is empty
    if math.prod(n for n in shape if n) * dtype.itemsize > np.iinfo(np.intp).max:
        raise WireError("shape", f"array shape {shape!r} is beyond what an array can hold")
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if declared != len(payload):
        raise WireError(
            "size",
            f"array declares {declared} bytes of {dtype_str}{tuple(shape)} but carries {len(payload)}",
        )
    # Copy so the array is writable (torch.from_numpy wants that) and native-endian.
    return np.frombuffer(payload, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def encode(message: Message) -> bytes:
    envelope = {
        "v": message.version,
        "type": message.type,
        "run": message.run,
        "round": message.round,
        "sender": message.sender,
        "body": message.body,
    }
    return cast("bytes", msgpack.packb(envelope, default=_default, use_bin_type=True))


def decode(raw: bytes, *, max_bytes: int | None = None) -> Message:
    """Decode and validate one message; raise WireError with a reason code."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise WireError("oversize", f"{len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        envelope = msgpack.unpackb(
            raw, raw=False, ext_hook=_unpack_array, strict_map_key=True, use_list=True
        )
    except WireError:
        raise
    except Exception as exc:
        raise WireError("malformed", f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(envelope, dict):
        raise WireError("malformed", "message is not a map")
    missing = _ENVELOPE_KEYS - envelope.keys()
    extra = envelope.keys() - _ENVELOPE_KEYS
    if missing or extra:
        raise WireError(
            "envelope", f"missing keys {sorted(missing)} / unknown keys {sorted(map(str, extra))}"
        )
    return Message(
        type=envelope["type"],
        run=envelope["run"],
        round=envelope["round"],
        sender=envelope["sender"],
        body=envelope["body"],
        version=envelope["v"],
    )


def pack_data(obj: Any) -> bytes:
    """msgpack any tree of maps, lists, scalars and arrays (checkpoints, state files)."""
    return cast("bytes", msgpack.packb(obj, default=_default, use_bin_type=True))


def unpack_data(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, ext_hook=_unpack_array, strict_map_key=False)
