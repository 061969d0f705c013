"""Many clients: bytes per client-round against N, rounds at N=100 and 1000, start-up.

Three parts, one run, one JSON (benchmarks/results/scale.json) and one plot
(docs/figures/bytes_vs_n.png; with --quick, benchmarks/results/bytes_vs_n-quick.png):

- ``bytes``: the payload bytes one client moves in one round (its upload, the broadcast
  it receives, its personal downlink) for N = 6, 30, 100, 300, 1000. Every figure is the
  length of a real message: the method's server side aggregates N valid uploads (random
  arrays of the shapes its upload schema permits, every class held) and
  ``encode_downlinks`` encodes the round as the coordinator does. The default job's shapes:
  C=21 classes, d=256, the CSI sample shape. FedAPA runs exact (``max_peer_sets`` above
  N, so every client receives all N sets as in the paper) and bounded (the default k=8).
  Weight methods reuse six bodies across the N uploads (their size does not depend on N,
  and 1000 LargeConvNet4 copies would need 3.7 GB).
- ``rounds``: FedAPA (bounded) rounds of the real coordinator against N = 100 and 1000
  load clients (:mod:`mqttfl.testing.loadclient`, one process, every subscription a real
  client has, every downlink decoded and validated). Goals: at N=1000 every client holds
  its complete downlink within 2 s of the last upload; at N=100 the coordinator adds at
  most 20 ms (last upload accepted -> downlinks acknowledged by the broker).
- ``startup``: wall time of ``mqttfl --help``, ``mqttfl broker init`` and a Python that
  imports the coordinator, each in a fresh process (median of 7). Goal: under 0.5 s.

    python -m benchmarks.bench_scale [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, RESULTS, bench_main, log, stats
from benchmarks.loadfed import coordinator_under_load

SIZES = (6, 30, 100, 300, 1000)
PLOT = REPO / "docs" / "figures" / "bytes_vs_n.png"  # full size: shown in docs/benchmarks/
CSI_SAMPLE_SHAPE = (1, 32, 242)  # the default job: 1 x window x subcarriers
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "FedAPA exact": ("fedapa", ["method.max_peer_sets=100000", "model.name=large"]),
    "FedAPA bounded (k=8)": ("fedapa", ["model.name=large"]),
    "FedProto": ("fedproto", ["model.name=large"]),
    "FedSAP": ("fedsap", ["model.name=large"]),
    "FedAPA global-avg": ("fedapa-global-avg", ["model.name=large"]),
    "FedAli (transformer)": ("fedali", ["model.name=transformer"]),
    "FedAvg LargeConvNet4": ("fedavg", ["model.name=large"]),
    "FedAvg MiddleConvNet4": ("fedavg", ["model.name=middle"]),
}
BOUND_BYTES = 250_000  # the bound for FedAPA at C=21, d=256
FULL_SET_GOAL_S = 2.0  # N=1000: last upload -> every client holds its downlink
OVERHEAD_GOAL_S = 0.020  # N=100: last upload accepted -> downlinks acknowledged
STARTUP_GOAL_S = 0.5


def _sample_body(schema: Any, rng: np.random.Generator) -> dict[str, Any]:
    """A valid body of ``schema`` at its largest dims (every class held)."""
    from mqttfl.wire.schemas import ArrayField, FloatField, IntField

    body: dict[str, Any] = {}
    for name, spec in schema.fields.items():
        if isinstance(spec, ArrayField):
            shape = tuple(
                d if isinstance(d, int) else schema.dims.get(d, (0, 1))[1] for d in spec.shape
            )
            dtype = np.dtype(spec.dtype)
            if dtype.kind == "f":
                body[name] = (0.1 * rng.standard_normal(shape)).astype(dtype)
            else:
                body[name] = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
        elif isinstance(spec, IntField):
            body[name] = 1
        elif isinstance(spec, FloatField):
            body[name] = 1.0
        else:
            raise TypeError(f"no sample for field {name!r} ({type(spec).__name__})")
    return body


def round_bytes(method: str, overrides: list[str], n: int) -> dict[str, Any]:
    """Encode one real round of ``method`` with ``n`` uploads; bytes per client."""
    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.algorithms.base import Upload
    from mqttfl.config import load_config
    from mqttfl.wire import Message, encode
    from mqttfl.wire.downlinks import encode_downlinks
    from mqttfl.wire.schemas import ClientInfo

    config = load_config(
        "configs/fedapa-csi.toml", [f"method={method}", f"federation.num_clients={n}", *overrides]
    )
    algorithm = get_algorithm(method)
    ctx = make_context(config)
    classes = tuple(range(config.model.num_classes))
    rng = np.random.default_rng(n)
    from mqttfl.algorithms.fedavg import FedAvgClient

    # weight uploads do not depend on N: six distinct bodies, reused
    distinct = min(n, 6) if issubclass(algorithm.client, FedAvgClient) else n
    uploads: list[Upload] = []
    upload_sizes: list[int] = []
    for i in range(n):
        info = ClientInfo(str(i), config.model.name, classes, 100, CSI_SAMPLE_SHAPE)
        if i < distinct:
            body = _sample_body(algorithm.upload_schema(ctx, info), rng)
            size = len(encode(Message("upload", config.run_id, 1, str(i), body)))
        else:
            body, size = dict(uploads[i % distinct].body), upload_sizes[i % distinct]
        uploads.append(Upload(str(i), info, body))
        upload_sizes.append(size)
    server = algorithm.server(ctx)
    began = time.perf_counter()
    down = server.aggregate(1, uploads)
    aggregate_s = time.perf_counter() - began
    payloads = encode_downlinks(config.run_id, 1, down.broadcast, down.personal)
    personal = [len(payloads.personal.get(str(i), b"")) for i in range(n)]
    per_client = [upload_sizes[i] + len(payloads.broadcast) + personal[i] for i in range(n)]
    return {
        "n": n,
        "upload_bytes": int(np.median(upload_sizes)),
        "broadcast_bytes": len(payloads.broadcast),
        "personal_bytes_max": max(personal),
        "down_bytes_per_client_max": len(payloads.broadcast) + max(personal),
        "bytes_per_client_round_median": float(np.median(per_client)),
        "bytes_per_client_round_max": max(per_client),
        "aggregate_s": aggregate_s,
    }


def bytes_vs_n(quick: bool) -> dict[str, Any]:
    sizes = SIZES[:3] if quick else SIZES
    table: dict[str, list[dict[str, Any]]] = {}
    for label, (method, overrides) in VARIANTS.items():
        table[label] = []
        for n in sizes:
            row = round_bytes(method, overrides, n)
            log(
                f"bytes: {label} N={n}: {row['bytes_per_client_round_max'] / 1000:.1f} KB "
                f"per client-round (down {row['down_bytes_per_client_max'] / 1000:.1f} KB)"
            )
            table[label].append(row)
    bounded = table["FedAPA bounded (k=8)"]
    worst = max(r["down_bytes_per_client_max"] for r in bounded)
    _plot(table, RESULTS / "bytes_vs_n-quick.png" if quick else PLOT)
    return {
        "sizes": list(sizes),
        "table": table,
        "goal": {
            "goal": "FedAPA bounded downlink <= ~250 KB per client-round at any N",
            "figure_bytes": worst,
            "met": worst <= BOUND_BYTES,
        },
    }


def _plot(table: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in table.items():
        ns = [r["n"] for r in rows]
        ax.plot(ns, [r["bytes_per_client_round_max"] / 1e6 for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clients N")
    ax.set_ylabel("MB per client-round (up + down)")
    ax.set_title("Payload per client-round, C=21, d=256")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rounds_at_scale(quick: bool) -> dict[str, Any]:
    sizes, rounds = ((100,), 2) if quick else ((100, 1000), 6)
    out: dict[str, Any] = {}
    for n in sizes:
        log(f"rounds: FedAPA bounded, N={n}, {rounds} rounds")
        loaded = coordinator_under_load(n, rounds)
        done = [r for r in loaded["rounds"] if "overhead_downlinks_s" in r]
        out[str(n)] = {
            "rounds": len(done),
            "uploads_accepted": [r["uploads_accepted"] for r in done],
            "complete_downlinks": [r["complete_downlinks"] for r in done],
            "down_bytes_per_client": stats(r["down_bytes_per_client"] for r in done),
            "personal_bytes_max": max((r["personal_bytes_max"] for r in done), default=0),
            "last_upload_to_all_downlinks_held_s": stats(
                r["last_upload_to_all_downlinks_held_s"]
                for r in done
                if "last_upload_to_all_downlinks_held_s" in r
            ),
            "overhead_downlinks_s": stats(r["overhead_downlinks_s"] for r in done),
            "aggregate_s": stats(r["aggregate_s"] for r in done),
            "fanin_s": stats(r["fanin_s"] for r in done),
            "rejections": loaded["rejections"],
            "load_process_imported_torch": loaded["load_process_imported_torch"],
            "per_round": loaded["rounds"],
        }
    goals = []
    if "1000" in out:
        held = out["1000"]["last_upload_to_all_downlinks_held_s"]
        complete = all(c == 1000 for c in out["1000"]["complete_downlinks"])
        goals.append(
            {
                "goal": "N=1000: every client holds its complete downlink within 2 s (median)",
                "figure_s": held.get("median"),
                "worst_round_s": held.get("max"),
                "all_complete": complete,
                "met": complete and held.get("median", 1e9) <= FULL_SET_GOAL_S,
            }
        )
    overhead = out["100"]["overhead_downlinks_s"]
    goals.append(
        {
            "goal": "N=100: coordinator overhead <= 20 ms",
            "figure_s": overhead.get("median"),
            "met": overhead.get("median", 1e9) <= OVERHEAD_GOAL_S,
        }
    )
    return {"by_n": out, "goals": goals}


def _time_command(cmd: list[str], repeats: int) -> dict[str, float]:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO, timeout=60)
        samples.append(time.perf_counter() - began)
    return stats(samples)


def startup(quick: bool) -> dict[str, Any]:
    repeats = 3 if quick else 7
    script = Path(sys.executable).parent / "mqttfl"  # the console script users run
    mqttfl = [str(script)] if script.exists() else [sys.executable, "-m", "mqttfl"]
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "python (interpreter alone)": _time_command([sys.executable, "-c", "pass"], repeats),
            "mqttfl --help": _time_command([*mqttfl, "--help"], repeats),
            "mqttfl broker init": _time_command(
                [
                    *mqttfl,
                    "broker",
                    "init",
                    "--run-id",
                    "bench",
                    "--clients",
                    "6",
                    "--force",
                    "--out",
                    str(Path(tmp) / "b"),
                ],
                repeats,
            ),
            "import mqttfl.nodes.coordinator": _time_command(
                [sys.executable, "-c", "import mqttfl.nodes.coordinator"], repeats
            ),
        }
    worst = max(v["median"] for k, v in rows.items() if k.startswith(("mqttfl", "import")))
    return {
        "commands": rows,
        "goal": {"goal": "start-up under 0.5 s", "figure_s": worst, "met": worst < STARTUP_GOAL_S},
    }


def run(quick: bool) -> dict[str, Any]:
    return {
        "startup": startup(quick),
        "bytes": bytes_vs_n(quick),
        "rounds": rounds_at_scale(quick),
    }


if __name__ == "__main__":
    bench_main("scale", __doc__.splitlines()[0], run)
