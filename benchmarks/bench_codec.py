"""Codec: encode and decode time per MB, for prototype and for weight payloads.

Messages as they cross the wire (``mqttfl.wire.encode``/``decode``, msgpack envelope
with arrays as raw little-endian bytes) and, separately, the upload gate's schema
check of a decoded body:

- prototypes: one FedAPA upload (C=21 × d=256 float32 + classes + counts, 21 KB) and the
  FedAPA broadcast P of a 6-client round (6 × 21 × 256 float32, 129 KB);
- weights: one FedAvg upload of LargeConvNet4 with 21 classes (flat float32 vector of
  every float entry of the state dict, 1.9 MB).

    python -m benchmarks.bench_codec [--quick]
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from benchmarks.common import bench_main, log, stats, time_calls

MB = 1_000_000


def payloads() -> dict[str, tuple[Any, Any]]:
    """name -> (message body, schema or None)."""
    from mqttfl.algorithms.base import Context
    from mqttfl.algorithms.common.prototype_uploads import prototype_schema
    from mqttfl.algorithms.common.weights import weights_length
    from mqttfl.algorithms.fedavg import weights_schema
    from mqttfl.wire.schemas import ClientInfo

    ctx = Context(num_classes=21, embed_dim=256, rounds=30, seed=0, params=None)
    rng = np.random.default_rng(0)
    info = ClientInfo("0", "large", tuple(range(21)), 320, (1, 64, 242))
    n_weights = weights_length(ctx, info)
    return {
        "prototypes_upload": (
            {
                "classes": np.arange(21, dtype=np.int64),
                "prototypes": rng.standard_normal((21, 256)).astype(np.float32),
            },
            prototype_schema(ctx),
        ),
        "prototypes_broadcast_n6": (
            {
                "available": np.ones(21, np.uint8),
                "prototypes": rng.standard_normal((6, 21, 256)).astype(np.float32),
                "_personal": [str(i) for i in range(6)],
            },
            None,
        ),
        "weights_upload_large": (
            {"weights": rng.standard_normal(n_weights).astype(np.float32), "num_samples": 320},
            weights_schema(ctx, info),
        ),
    }


def run(quick: bool) -> dict[str, Any]:
    from mqttfl.wire import Message, decode, encode

    repeats = 7 if quick else 25
    rows = []
    for name, (body, schema) in payloads().items():
        message = Message("upload", "bench", 3, "0", body)
        raw = encode(message)
        size_mb = len(raw) / MB
        decoded = decode(raw)
        enc = time_calls(partial(encode, message), repeats=repeats, min_time_s=0.05)
        dec = time_calls(partial(decode, raw), repeats=repeats, min_time_s=0.05)
        row: dict[str, Any] = {
            "payload": name,
            "bytes": len(raw),
            "array_bytes": sum(v.nbytes for v in body.values() if isinstance(v, np.ndarray)),
            "encode_s_per_message": stats(enc),
            "decode_s_per_message": stats(dec),
            "encode_ms_per_mb": stats(t * 1000 / size_mb for t in enc),
            "decode_ms_per_mb": stats(t * 1000 / size_mb for t in dec),
        }
        if schema is not None:
            val = time_calls(
                partial(schema.validate, decoded.body), repeats=repeats, min_time_s=0.05
            )
            row["validate_ms_per_mb"] = stats(t * 1000 / size_mb for t in val)
        rows.append(row)
        log(
            f"codec {name}: encode {row['encode_ms_per_mb']['median']:.2f} ms/MB, "
            f"decode {row['decode_ms_per_mb']['median']:.2f} ms/MB"
        )
    return {
        "what": "mqttfl.wire encode/decode (and the gate's schema check) in ms per MB of message, "
        "median over samples of >= 50 ms each",
        "payloads": rows,
    }


def main() -> None:
    bench_main("codec", "codec benchmark", run)


if __name__ == "__main__":
    main()
