"""Cross-room benefit: how much a client gains from the other rooms' data at all.

Whether federation can beat Local is a property of the data before it is one of the
method. This study measures it with no method in the way, per client:

- ``local``: a model trained on the client's own training split only;
- ``pooled``: one model trained on the union of every client's training split
  (:mod:`mqttfl.evaluation.pooled`; absent where the clients' samples differ in shape);
- ``fedavg_ft``: FedAvg, then fine-tuning the global model on the own split (the
  ``wifed`` method: FedAvg-then-fine-tune, so it also works across input shapes).

Everything but the data is shared: the config's model, initial weights, ``[train]``
recipe and epoch budget (``rounds × local_epochs``). Runs are in-process (no broker: this
measures data, not transport) and every method is scored once, after its last round, on
each client's own test split. ``gain`` is a row's mean accuracy minus Local's, with the
per-seed values beside it.

Federations: the real ESPectre recordings (5 ESP32 chips in one home) and the simulated
rooms of :mod:`mqttfl.data.synthetic`, once with a different NIC per room (the simulator
before this study) and once with every room on the paper's 242-subcarrier grid.

    python -m benchmarks.bench_crossroom [--quick]

``BENCH_CROSSROOM_ONLY=name[,name]`` reruns those federations and keeps the others' results
from the existing JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from benchmarks.common import RESULTS, bench_main, intel5300_root, log

if TYPE_CHECKING:
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard

SESSIONS = ("may", "august")  # one client per recording month, the same home and NIC


def intel5300_sessions(config: RunConfig) -> dict[str, Shard]:
    """Brushing teeth against washing dishes, one client per month (May, August 2020).

    Windows are z-scored per subcarrier on the client's own training windows (``data
    prepare --normalize``): the raw Intel 5300 amplitudes (mean ~26) left every model at
    chance within this budget."""
    from mqttfl.data.shard_builder import build_shards

    root = intel5300_root(config.data)
    files = [str(f) for month in SESSIONS for f in sorted((root / month).glob("*.dat"))]
    shards = build_shards(
        "intel5300",
        files,
        labels="filename",
        window=config.data.window,
        group_by="dir",
        classes=["brushteeth", "washingdishes"],
        normalize=True,
        # session split: each recording (file) is a session; per activity the latest of a
        # month's three is the test session
        split=config.data.split,
        session="file",
    )
    return {str(i): shard for i, shard in enumerate(shards)}


def one_room(config: RunConfig) -> dict[str, Shard]:
    """Six clients who all live in room 0 (client ids 0, 6, 12, ...), each recording its
    own sessions: whether data from the very same room, but other crowd layouts, helps."""
    from mqttfl.data.synthetic import make_room_shard

    data = config.data
    return {
        str(i): make_room_shard(
            6 * i,
            seed=config.seed,
            window=data.window,
            samples=data.samples_per_client,
            num_classes=config.model.num_classes,
            test_fraction=data.test_fraction,
            device=data.device,
            split=data.split,
        )
        for i in range(config.federation.num_clients)
    }


# name -> (config, overrides, note, shard loader; None: the config's own clients)
Loader = Callable[["RunConfig"], dict[str, "Shard"]] | None
FEDERATIONS: dict[str, tuple[str, list[str], str, Loader]] = {
    "espectre": ("configs/presence-espectre.toml", [], "real: 5 ESP32 chips, one home", None),
    "intel5300-sessions": (
        "configs/presence-espectre.toml",
        ["data.window=50", "model.name=middle"],
        "real: one Intel 5300 in one home, May against August, 2 activities",
        intel5300_sessions,
    ),
    "rooms-per-room-nic": (
        "configs/fedapa-csi.toml",
        ["data.device=per-room"],
        "simulator as shipped: each room records with a different NIC (30-242 subcarriers)",
        None,
    ),
    "rooms-one-grid": (
        "configs/fedapa-csi.toml",
        ["data.device=nexmon-vht80"],
        "simulator, every room on the 242-subcarrier VHT80 grid (FedAPA Sec. V-B)",
        None,
    ),
    "rooms-one-grid-small": (
        "configs/fedapa-csi.toml",
        ["data.device=nexmon-vht80", "data.samples_per_client=120"],
        "as rooms-one-grid with 96 training windows per client instead of 320",
        None,
    ),
    "one-room": (
        "configs/fedapa-csi.toml",
        ["data.device=nexmon-vht80"],
        "simulator, six clients of one room, each with its own sessions",
        one_room,
    ),
}


class Sizes(TypedDict):
    seeds: list[int]  # the seeds each federation is run with
    rooms: list[str]  # extra overrides for the federations of configs/fedapa-csi.toml


FULL: Sizes = {"seeds": [0, 1, 2], "rooms": ["rounds=30"]}
QUICK: Sizes = {"seeds": [0], "rooms": ["rounds=2", "data.samples_per_client=60", "data.window=16"]}
#: BENCH_CROSSROOM_SPLITS: the data.split values to study (each federation under each)
SPLITS = ("window", "session")


def federate(config: RunConfig, shards: dict[str, Shard], method: str) -> dict[str, float]:
    """Accuracy per client after ``config.rounds`` full-participation rounds of ``method``,
    run in this process with the method's own client and server sides."""
    import torch

    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.algorithms.base import Upload
    from mqttfl.nodes.device import build_client_side, round_rng
    from mqttfl.training.metrics import classification_report

    config = config.model_copy(update={"method": method})
    algorithm = get_algorithm(method)
    ctx = make_context(config)
    server = algorithm.server(ctx)
    sides = {
        cid: build_client_side(config, algorithm, ctx, cid, shard) for cid, shard in shards.items()
    }
    torch.set_num_threads(1)
    with ThreadPoolExecutor(2) as pool:  # two clients train at once on the 2 cores
        for t in range(1, config.rounds + 1):
            params = server.round_params(t)

            def train(cid: str, t: int = t, params: dict[str, Any] = params) -> Upload:
                side = sides[cid]
                side.train(t, dict(params), round_rng(config.seed, side.info, t))
                return Upload(cid, side.info, side.make_upload(t))

            downlinks = server.aggregate(t, list(pool.map(train, sides)))
            for cid, side in sides.items():
                side.receive(t, downlinks.broadcast, downlinks.personal.get(cid))
        scores = pool.map(
            lambda cid: classification_report(
                shards[cid].y_test, sides[cid].predict(shards[cid].x_test)
            )["accuracy"],
            sides,
        )
        return dict(zip(sides, scores, strict=True))


def study(config: RunConfig, shards: dict[str, Shard]) -> dict[str, Any]:
    """Local, Pooled and FedAvg-then-fine-tune accuracy per client for one seed."""
    import torch

    from mqttfl.evaluation.pooled import pooled_reference

    row: dict[str, Any] = {}
    for name, method in (("local", "local"), ("fedavg_ft", "wifed")):
        start = time.perf_counter()
        row[name] = federate(config, shards, method)
        log(
            f"  {name}: {np.mean(list(row[name].values())):.2f} ({time.perf_counter() - start:.0f} s)"
        )
    if os.environ.get("BENCH_CROSSROOM_POOLED") == "0":  # a busy machine's reduced study
        row["pooled_absent"] = "not run (BENCH_CROSSROOM_POOLED=0)"
        return row
    torch.set_num_threads(2)
    pooled = pooled_reference(config, shards)
    if isinstance(pooled, str):
        row["pooled_absent"] = pooled
    else:
        row["pooled"] = {cid: r["accuracy"] for cid, r in pooled.per_client.items()}
        log(f"  pooled: {pooled.mean['accuracy']:.2f}")
    return row


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    def mean_acc(row: dict[str, Any], key: str) -> float:
        return float(np.mean(list(row[key].values())))

    out: dict[str, Any] = {}
    for key in ("local", "pooled", "fedavg_ft"):
        if not all(key in row for row in per_seed):
            continue
        values = [mean_acc(row, key) for row in per_seed]
        out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values)), "seeds": values}
        if key != "local":
            gains = [v - mean_acc(row, "local") for v, row in zip(values, per_seed, strict=True)]
            out[key]["gain"] = float(np.mean(gains))
            out[key]["gain_seeds"] = gains
            clients = per_seed[0][key]
            out[key]["clients_gaining"] = [
                sum(row[key][c] > row["local"][c] for c in clients) for row in per_seed
            ]
    absent = [row["pooled_absent"] for row in per_seed if "pooled_absent" in row]
    if absent:
        out["pooled_absent"] = absent[0]
    return out


def run(quick: bool) -> dict[str, Any]:
    from mqttfl.config import load_config
    from mqttfl.evaluation.pooled import client_shards

    sizes = QUICK if quick else FULL
    only = [n for n in os.environ.get("BENCH_CROSSROOM_ONLY", "").split(",") if n]
    results: dict[str, Any] = {}
    previous = RESULTS / f"crossroom{'-quick' if quick else ''}.json"
    if only and previous.exists():
        results = json.loads(previous.read_text())["federations"]
    splits = [x for x in os.environ.get("BENCH_CROSSROOM_SPLITS", "").split(",") if x]
    rooms = [x for x in os.environ.get("BENCH_CROSSROOM_ROOMS", "").split(";") if x]
    plan = [
        (f"{name}@{split}", split, spec)
        for name, spec in FEDERATIONS.items()
        for split in (splits or SPLITS)
        if not only or name in only
    ]
    for key, split, (path, overrides, note, loader) in plan:
        name = key
        extra = (rooms or sizes["rooms"]) if path.endswith("fedapa-csi.toml") else []
        if quick and not extra:
            extra = ["rounds=2"]
        extra = [*extra, f"data.split={split}"]
        per_seed = []
        start = time.perf_counter()
        seeds = os.environ.get("BENCH_CROSSROOM_SEEDS")
        for seed in [int(x) for x in seeds.split(",")] if seeds else sizes["seeds"]:
            log(f"{name}, seed {seed}")
            config = load_config(path, [*overrides, *extra, f"seed={seed}"])
            try:
                shards = (loader or client_shards)(config)
            except FileNotFoundError as missing:
                results[name] = {"note": note, "absent": f"data missing: {missing}"}
                break
            sizes_of = [len(s.y_train) for s in shards.values()]
            per_seed.append(study(config, shards))
        else:
            results[name] = {
                "note": note,
                "split": split,
                "config": path,
                "overrides": [*overrides, *extra],
                "clients": len(per_seed[0]["local"]),
                "train_samples_per_client": sizes_of,
                **summarize(per_seed),
                "per_seed": per_seed,
                "seconds": round(time.perf_counter() - start, 1),
            }
    return {
        "what": "per-client test accuracy of Local, Pooled (one model on all clients' data) and "
        "FedAvg-then-fine-tune, same model, recipe and epoch budget; gain = row - Local",
        "federations": results,
    }


def main() -> None:
    bench_main("crossroom", "cross-room benefit study", run)


if __name__ == "__main__":
    main()
