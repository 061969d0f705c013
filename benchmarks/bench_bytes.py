"""Bytes: payload bytes per client-round of every method, from real runs, against theory.

For each registered method (``mqttfl.algorithms.algorithm_names()``) one short real
federation of the default job (6 synthetic CSI rooms, LargeConvNet4, 21 classes, d=256)
runs with an extra MQTT subscriber that sizes every upload and downlink as the broker
passed it on. Reported per method and direction:

- payload bytes per client-round (the coordinator's summary, which counts what it
  accepted and sent; the per-message sizes seen on the bus agree with it);
- content bytes: the raw bytes of the arrays (plus 8 per scalar, UTF-8 of strings) in
  the message bodies, i.e. what a perfect zero-overhead encoding would carry;
- framing overhead = payload / content - 1 (the msgpack envelope and array headers),
  and with the MQTT PUBLISH header and topic added. Goal: at most 2%.
- the FedAPA paper's Table V figure where it gives one: FedAvg, WiFed and FedCaring
  2·Σw (Σw = the model's parameters, float32), FedAPA Σp·(N+1)·C (Σp = d float32).
  mqttfl sends FedAPA's (N+1)·C prototypes down (P of the N clients plus Q_i) and C up,
  so its total is (N+2)·C·Σp plus the per-class counts; the table shows both.

    python -m benchmarks.bench_bytes [--quick] [--methods fedapa,fedavg]
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from typing import Any

from benchmarks.common import REPO, WORK, log, write_result
from benchmarks.federation import run_federation

CONFIG = "configs/fedapa-csi.toml"
CLIENTS = 6
CLASSES = 21
DIM = 256
FRAMING_GOAL = 0.02
PAPER_KB = {"fedavg": 3710.0, "fedcaring": 3710.0, "wifed": 3710.0, "fedapa": 150.53}


def _required_model() -> dict[str, str]:
    try:
        from mqttfl.evaluation.compare_entries import REQUIRED_MODEL
    except ImportError:
        return {}
    return dict(REQUIRED_MODEL)


def _parameter_count(arch: str) -> int:
    from mqttfl.models import build_model

    model = build_model(arch, num_classes=CLASSES, embed_dim=DIM)
    return sum(p.numel() for p in model.parameters())


def theoretical_bytes(method: str, arch: str) -> dict[str, Any] | None:
    """Table V of the FedAPA paper, in bytes per client-round (float32)."""
    if method in ("fedavg", "wifed", "fedcaring"):
        sigma_w = _parameter_count(arch)
        return {"formula": "2·Σw", "bytes": 2 * sigma_w * 4, "sigma_w": sigma_w}
    if method == "fedapa":
        return {
            "formula": "Σp·(N+1)·C",
            "bytes": DIM * 4 * (CLIENTS + 1) * CLASSES,
            "n": CLIENTS,
            "c": CLASSES,
            "sigma_p": DIM,
        }
    return None


def _mqtt_header(topic_bytes: int, payload: int) -> int:
    remaining = 2 + topic_bytes + 2 + payload  # topic length, topic, packet id (QoS 1), payload
    varint = 1 if remaining < 128 else 2 if remaining < 16384 else 3 if remaining < 2097152 else 4
    return 1 + varint + 2 + topic_bytes + 2


def analyse(records: list[dict[str, Any]]) -> dict[str, Any]:
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        direction = "up" if r["kind"] == "up" else "down"
        sums[direction]["messages"] += 1
        sums[direction]["bytes"] += r["bytes"]
        sums[direction]["content_bytes"] += r["array_bytes"]
        sums[direction]["mqtt_bytes"] += r["bytes"] + _mqtt_header(r["topic_bytes"], r["bytes"])
    out: dict[str, Any] = {}
    for direction, s in sums.items():
        content = s["content_bytes"]
        out[direction] = {
            **s,
            "framing_overhead": (s["bytes"] / content - 1) if content else None,
            "framing_overhead_with_mqtt": (s["mqtt_bytes"] / content - 1) if content else None,
            "fields": sorted(
                {
                    f
                    for r in records
                    if ("up" if r["kind"] == "up" else "down") == direction
                    for f in r["fields"]
                }
            ),
        }
    return out


def run(quick: bool, methods: list[str] | None = None) -> dict[str, Any]:
    from mqttfl.algorithms import algorithm_names

    rounds = 2 if quick else 3
    required = _required_model()
    rows: list[dict[str, Any]] = []
    for method in methods or algorithm_names():
        arch = required.get(method, "large")
        overrides = [
            f"method={method}",
            f"rounds={rounds}",
            f"run_id=bench-bytes-{method}",
            f"federation.num_clients={CLIENTS}",
            "data.samples_per_client=120",
            "data.window=24",
        ]
        if method in required:
            overrides += [f"model.name={arch}", "model.per_client=[]"]
        try:
            result = run_federation(CONFIG, overrides, WORK / f"bytes-{method}", sniff=True)
        except Exception as exc:
            log(f"bytes {method}: failed: {exc}")
            rows.append({"method": method, "error": str(exc)})
            continue
        comm = result.summary.comm
        up, down = comm.up_bytes_per_client_round, comm.down_bytes_per_client_round
        row: dict[str, Any] = {
            "method": method,
            "model": arch,
            "rounds": rounds,
            "clients": CLIENTS,
            "up_bytes_per_client_round": up,
            "down_bytes_per_client_round": down,
            "total_bytes_per_client_round": up + down,
            "wire": analyse(result.sniffed),
        }
        theory = theoretical_bytes(method, arch)
        if theory is not None:
            row["theoretical"] = theory
            row["measured_over_theoretical"] = (up + down) / theory["bytes"]
            row["paper_practical_kb"] = PAPER_KB.get(method)
        framings = [
            v["framing_overhead"]
            for v in row["wire"].values()
            if v.get("framing_overhead") is not None
        ]
        row["worst_framing_overhead"] = max(framings) if framings else None
        rows.append(row)
        log(
            f"bytes {method}: up {up / 1000:.2f} KB, down {down / 1000:.2f} KB per client-round, "
            f"framing {row['worst_framing_overhead']}"
        )
    worst = max(
        (r["worst_framing_overhead"] for r in rows if r.get("worst_framing_overhead") is not None),
        default=None,
    )
    return {
        "what": "payload bytes per client-round from real runs (6 clients, LargeConvNet4, C=21, d=256) "
        "against the FedAPA paper's Table V; framing overhead = payload / raw content - 1",
        "goal": {
            "text": "framing overhead at most 2%",
            "limit": FRAMING_GOAL,
            "figure": worst,
            "met": worst is not None and worst <= FRAMING_GOAL,
            "figure_is": "worst method and direction",
        },
        "methods": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="bytes benchmark")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--methods", help="comma-separated subset (default: every registered method)"
    )
    args = parser.parse_args()
    os.chdir(REPO)  # configs/ and `python -m` paths are relative to the checkout
    methods = args.methods.split(",") if args.methods else None
    path = write_result(
        "bytes",
        run(args.quick, methods),
        quick=args.quick,
        command=f"python -m benchmarks.bench_bytes{' --quick' if args.quick else ''}",
    )
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
