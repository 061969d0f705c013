"""Across sessions: every method under the window split and the session split.

On a public crowd-counting set the prototype methods win the window split (test
windows from the sessions a client trained on) and lose the session split (a day never
trained on). This benchmark measures the same two splits on our own sources, in process
(each method's own client and server sides, no broker), ``SEEDS`` seeds each:

- ``espectre``: the 5 ESP32 chips of one home (configs/presence-espectre.toml). Session
  split: every recording is a session and a chip's later recording of each label is its
  test session (C3 keeps its ``test/`` recording as test under both splits).
- ``intel5300``: one Intel 5300 in one home, brushing teeth against washing dishes,
  recorded in May and in August 2020 (three recordings per activity and month). Three
  clients, client k holding the k-th recording of each activity of one month; session
  split: it trains on the whole of its recordings and tests on the k-th recordings of the
  *other* month (both directions, May→August and August→May, are run and averaged, so no
  client ever trains on a test month); window split: it trains on the first 80% of its
  recordings' windows and tests on the last 20%.
- ``rooms``: the simulated rooms (configs/fedapa-csi.toml made small: MiddleConvNet4,
  d=64, 10 rounds, 200 samples per client, one 242-subcarrier grid), session split by
  recording day.

Bytes are the encoded payloads (the wire codec's msgpack) per client-round: the client's
upload, plus the round's broadcast and its personal downlink.

    python -m benchmarks.bench_sessions [--quick]

``BENCH_SESSIONS_SOURCES=espectre,intel5300`` and ``BENCH_SESSIONS_METHODS=local,fedavg``
restrict the grid (the other entries of an existing JSON are kept);
``BENCH_SESSIONS_SEEDS=0,1,2`` sets the seeds, ``BENCH_SESSIONS_SPLITS=session`` the splits.
:data:`METHODS` past the first ``DEFAULT_METHODS`` are ablations and variants, run when named.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.common import RESULTS, bench_main, intel5300_root, log

if TYPE_CHECKING:
    from mqttfl.algorithms.base import ClientSide
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard

ACTIVITIES = ("brushteeth", "washingdishes")
MONTHS = ("may", "august")
SPLITS = ("window", "session")
#: half the shipped ESPectre recipe's 20 rounds (and its warm-up), so that the whole grid
#: runs on two shared cores; every method gets the same budget
SHORT = ["rounds=10", "method.warmup_rounds=5"]

#: method name -> (registered method, extra ``method.*`` overrides)
METHODS: dict[str, tuple[str, list[str]]] = {
    "local": ("local", []),
    "fedavg": ("fedavg", []),
    "wifed": ("wifed", []),
    "fedproto": ("fedproto", []),
    "fedsap": ("fedsap", []),
    "fedpam": ("fedpam", []),
    "fedapa": ("fedapa", []),
    "fedapa-session": ("fedapa-session", []),
    # FedAPA-S adapting every session, without the shift gate (the first FedAPA-S)
    "fedapa-session-always": ("fedapa-session", ["method.gate=false"]),
    # ablations and variants (docs/sessions.md)
    "fedapa-no-lc": ("fedapa", ["method.use_client_prototypes=false"]),
    "fedapa-no-warmup": ("fedapa", ["method.warmup_rounds=1"]),
    "fedapa-global-avg": ("fedapa-global-avg", []),
    "fedapa-session-with-lc": ("fedapa-session", ["method.use_client_prototypes=true"]),
    "fedapa-session-head": ("fedapa-session", ["method.inference=head"]),
    "fedapa-session-nearest": ("fedapa-session", ["method.refine_steps=0"]),
    "fedapa-session-no-adabn": ("fedapa-session", ["method.adapt_norm=false"]),
    "local+adabn": ("local", []),
    "fedavg+adabn": ("fedavg", []),
    "fedproto+adabn": ("fedproto", []),
    # Table III's other baseline: each local model weighted 1 or 0.3 by how well it scores
    "fedcaring": ("fedcaring", []),
}
#: the first methods of :data:`METHODS`, run unless BENCH_SESSIONS_METHODS names others
DEFAULT_METHODS = 9


@dataclass
class Source:
    config: str
    overrides: list[str]
    note: str
    #: (config, split) -> the federations to run, each {client id: shard}
    loader: Callable[[RunConfig, str], list[dict[str, Shard]]] | None = None
    quick: list[str] = field(default_factory=list)


def config_shards(config: RunConfig, split: str) -> list[dict[str, Shard]]:
    from mqttfl.evaluation.pooled import client_shards

    return [client_shards(config.model_copy(update={"data": _with_split(config, split)}))]


def _with_split(config: RunConfig, split: str) -> Any:
    return config.data.model_copy(update={"split": split})


def _recording_windows(config: RunConfig) -> dict[tuple[str, str], list[tuple[Any, Any]]]:
    """(month, activity) -> per recording (first 80% of windows, last 20%), raw amplitude."""
    from mqttfl.data.shard_builder import build_shards

    root = intel5300_root(config.data)
    out: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
    for month in MONTHS:
        for activity in ACTIVITIES:
            files = sorted((root / month).glob(f"{activity}_*.dat"))
            shards = build_shards(
                "intel5300",
                [str(f) for f in files],
                labels="filename",
                window=config.data.window,
                group_by="file",
                classes=list(ACTIVITIES),
                test_fraction=0.2,
            )
            out[month, activity] = [(s.x_train, s.x_test) for s in shards]
    return out


def _zscore_shard(
    x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, meta: dict[str, Any]
) -> Shard:
    """Per-subcarrier z-score on the client's own training windows (``--normalize``)."""
    from mqttfl.data.shard import Shard

    mean = x_tr.mean(axis=(0, 1), keepdims=True)
    std = x_tr.std(axis=(0, 1), keepdims=True) + 1e-6
    return Shard(
        ((x_tr - mean) / std).astype(np.float32),
        y_tr.astype(np.int64),
        ((x_te - mean) / std).astype(np.float32),
        y_te.astype(np.int64),
        meta,
    )


def intel5300_shards(config: RunConfig, split: str) -> list[dict[str, Shard]]:
    """Two federations (trained in May, trained in August) of three clients each."""
    windows = _recording_windows(config)
    federations = []
    for month in MONTHS:
        other = MONTHS[1 - MONTHS.index(month)]
        tested = other if split == "session" else month
        shards: dict[str, Shard] = {}
        for k in range(3):
            parts: dict[str, list[np.ndarray]] = {"xtr": [], "ytr": [], "xte": [], "yte": []}
            for label, activity in enumerate(ACTIVITIES):
                head, tail = windows[month, activity][k]
                if split == "window":
                    train, test = head, tail
                else:
                    train = np.concatenate([head, tail])
                    test = np.concatenate(windows[other, activity][k])
                parts["xtr"].append(train)
                parts["ytr"].append(np.full(len(train), label))
                parts["xte"].append(test)
                parts["yte"].append(np.full(len(test), label))
            shards[str(k)] = _zscore_shard(
                np.concatenate(parts["xtr"]),
                np.concatenate(parts["ytr"]),
                np.concatenate(parts["xte"]),
                np.concatenate(parts["yte"]),
                {"source": "intel5300", "trained": month, "tested": tested},
            )
        federations.append(shards)
    return federations


def intel5300_file_shards(config: RunConfig, split: str) -> list[dict[str, Shard]]:
    """``data prepare --format intel5300 --group-by dir --normalize --session file``: a
    client per month, a session per recording; the session split tests each client on its
    latest recording of each activity (seconds to minutes after the others). The
    cross-room study's federation (:func:`benchmarks.bench_crossroom.intel5300_sessions`)."""
    from benchmarks.bench_crossroom import intel5300_sessions

    return [intel5300_sessions(config.model_copy(update={"data": _with_split(config, split)}))]


SOURCES: dict[str, Source] = {
    "espectre": Source(
        "configs/presence-espectre.toml",
        SHORT,
        "real: 5 ESP32 chips in one home, a session per recording",
        config_shards,
        ["rounds=3"],
    ),
    "intel5300": Source(
        "configs/presence-espectre.toml",
        [*SHORT, "data.window=25", "federation.num_clients=3"],
        "real: one Intel 5300 in one home, May against August, 2 activities",
        intel5300_shards,
        ["rounds=3"],
    ),
    "intel5300-file": Source(
        "configs/presence-espectre.toml",
        [*SHORT, "data.window=25", "federation.num_clients=2"],
        "real: one Intel 5300, a client per month, a session per recording (data prepare)",
        intel5300_file_shards,
        ["rounds=3"],
    ),
    "rooms": Source(
        "configs/fedapa-csi.toml",
        [
            *SHORT,
            "model.name=middle",
            "model.embed_dim=64",
            "data.samples_per_client=200",
            "data.window=32",
            "data.device=nexmon-vht80",
        ],
        "simulated rooms, one 242-subcarrier grid, a session per recording day",
        config_shards,
        ["rounds=2", "data.samples_per_client=60"],
    ),
    # the default job itself (configs/fedapa-csi.toml as shipped: 15 rounds, LargeConvNet4,
    # 400 windows of 64 packets per client); not in the default grid: the costliest
    "default": Source(
        "configs/fedapa-csi.toml",
        [],
        "the default job: 6 simulated rooms, as shipped",
        config_shards,
        ["rounds=2", "data.samples_per_client=60"],
    ),
}
#: the sources run unless BENCH_SESSIONS_SOURCES names others
DEFAULT_SOURCES = ("espectre", "intel5300", "intel5300-file", "rooms")


def payload_bytes(kind: str, t: int, client: str, body: Mapping[str, object]) -> int:
    from mqttfl.wire import Message, encode

    return len(encode(Message(kind, "bench", t, client, dict(body))))


@dataclass
class FederationResult:
    accuracy: dict[str, float]
    up: float  # mean encoded upload bytes per client-round
    down: float  # mean encoded downlink bytes (broadcast + personal) per client-round
    sides: dict[str, ClientSide]
    #: FedAPA-S's gate per client: adapted (0/1), fit ratio, shift score, threshold
    gate: dict[str, dict[str, float]] = field(default_factory=dict)


def adabn_predict(side: ClientSide, x: np.ndarray) -> np.ndarray:
    """The classifier head after FedAPA-S's test-time BatchNorm statistics
    (:func:`~mqttfl.algorithms.fedapa.session.renormalize`): the adaptation alone, applied
    to a method that does not have it."""
    from mqttfl.algorithms.fedapa.session import renormalize
    from mqttfl.training.loops import predict_logits

    labels: np.ndarray = predict_logits(renormalize(side.model, x), x).argmax(axis=1)
    return labels


def federate(
    config: RunConfig, shards: dict[str, Shard], method: str, *, adabn: bool = False
) -> FederationResult:
    """``config.rounds`` full-participation rounds of ``method`` in this process, scored
    once after the last round on each client's test split."""
    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.algorithms.base import Upload
    from mqttfl.nodes.device import build_client_side, round_rng

    config = config.model_copy(update={"method": method})
    algorithm = get_algorithm(method)
    predict = adabn_predict if adabn else (lambda side, x: side.predict(x))
    ctx = make_context(config)
    server = algorithm.server(ctx)
    sides = {
        cid: build_client_side(config, algorithm, ctx, cid, shard) for cid, shard in shards.items()
    }
    up: list[int] = []
    down: list[int] = []
    for t in range(1, config.rounds + 1):
        params = server.round_params(t)
        uploads = []
        for cid, side in sides.items():
            side.train(t, dict(params), round_rng(config.seed, side.info, t))
            body = side.make_upload(t)
            up.append(payload_bytes("upload", t, cid, body))
            uploads.append(Upload(cid, side.info, body))
        downlinks = server.aggregate(t, uploads)
        broadcast = payload_bytes("downlink", t, "all", downlinks.broadcast)
        for cid, side in sides.items():
            personal = downlinks.personal.get(cid)
            extra = payload_bytes("downlink", t, cid, personal) if personal else 0
            down.append(broadcast + extra)
            side.receive(t, downlinks.broadcast, personal)
    accuracy: dict[str, float] = {}
    gate: dict[str, dict[str, float]] = {}
    for cid, side in sides.items():
        accuracy[cid] = float(np.mean(predict(side, shards[cid].x_test) == shards[cid].y_test))
        decision = getattr(side, "last_decision", None)
        if decision is not None:
            gate[cid] = {
                "adapted": float(decision.adapted),
                "ratio": float("nan") if decision.ratio is None else decision.ratio,
                "shift": float("nan") if decision.shift is None else decision.shift,
                "threshold": float("nan") if decision.threshold is None else decision.threshold,
            }
    return FederationResult(accuracy, float(np.mean(up)), float(np.mean(down)), sides, gate)


def load(source: Source, seed: int, split: str, extra: list[str]) -> tuple[Any, list[Any]]:
    from mqttfl.config import load_config

    config = load_config(source.config, [*source.overrides, *extra, f"seed={seed}"])
    assert source.loader is not None
    return config, source.loader(config, split)


def score(source: Source, method: str, seed: int, split: str, extra: list[str]) -> dict[str, Any]:
    """Mean client accuracy (%) over the source's federations, and bytes per client-round."""
    registered, overrides = METHODS[method]
    config, federations = load(source, seed, split, [*extra, *overrides])
    adabn = method.endswith("+adabn")
    results = [federate(config, shards, registered, adabn=adabn) for shards in federations]
    accuracy = [a for r in results for a in r.accuracy.values()]
    out: dict[str, Any] = {
        "accuracy": 100.0 * float(np.mean(accuracy)),
        "up": float(np.mean([r.up for r in results])),
        "down": float(np.mean([r.down for r in results])),
    }
    gates = [g for r in results for g in r.gate.values()]
    if gates:
        out["gate"] = gates
    return out


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    values = [run["accuracy"] for run in runs.values()]
    first = next(iter(runs.values()))
    gates = [g for run in runs.values() for g in run.get("gate", [])]
    extra: dict[str, Any] = {}
    if gates:
        extra["adapted_fraction"] = float(np.mean([g["adapted"] for g in gates]))
        extra["gate"] = {seed: run["gate"] for seed, run in runs.items()}
    return {
        **extra,
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "seeds": values,
        "up_bytes": first["up"],
        "down_bytes": first["down"],
        "bytes": first["up"] + first["down"],
    }


def _listed(name: str, default: list[str]) -> list[str]:
    return [v for v in os.environ.get(name, "").split(",") if v] or default


def run(quick: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in _listed("BENCH_SESSIONS_SEEDS", ["0", "1", "2"])]
    sources = _listed("BENCH_SESSIONS_SOURCES", list(DEFAULT_SOURCES))
    methods = _listed("BENCH_SESSIONS_METHODS", list(METHODS)[:DEFAULT_METHODS])
    previous = RESULTS / f"sessions{'-quick' if quick else ''}.json"
    results: dict[str, Any] = {}
    if previous.exists():
        results = json.loads(previous.read_text()).get("sources", {})
    for name in sources:
        source = SOURCES[name]
        extra = source.quick if quick else []
        entry = results.setdefault(name, {"note": source.note, "splits": {}})
        entry.update(config=source.config, overrides=[*source.overrides, *extra])
        for split in _listed("BENCH_SESSIONS_SPLITS", list(SPLITS)):
            table = entry["splits"].setdefault(split, {})
            for method in methods:
                start = time.perf_counter()
                try:
                    runs = {str(s): score(source, method, s, split, extra) for s in seeds}
                except FileNotFoundError as missing:
                    entry["absent"] = f"data missing: {missing}"
                    break
                table[method] = summarize(runs)
                log(
                    f"{name} {split} {method}: {table[method]['mean']:.1f} "
                    f"± {table[method]['std']:.1f}, {table[method]['bytes'] / 1e3:.1f} kB "
                    f"({time.perf_counter() - start:.0f} s)"
                )
    return {
        "what": "mean client test accuracy (%) over seeds under the window and session splits; "
        "bytes: encoded upload + downlink per client-round",
        "seeds": seeds,
        "sources": results,
    }


def main() -> None:
    bench_main("sessions", "window split against session split", run)


if __name__ == "__main__":
    main()
