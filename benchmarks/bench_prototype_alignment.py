"""Why FedAPA gains little over Local on the default job under the papers' split.

The default job (configs/fedapa-csi.toml as shipped) under ``data.split=window``: each
client's test windows are a fifth of each of its days. Per seed, in one process and one
thread, FedAPA and Local are trained (:func:`benchmarks.bench_sessions.federate`: full
participation, scored after the last round) and this is measured:

* **what Q_i takes from peers**: α_ii of Eq. 6 over the uploads of rounds 1, 5, 10 and
  the last, the mean over clients and held classes (1: Q_i is the client's own prototype);
* **whether the rooms' prototypes line up by count**: for a client i, a peer j and a
  count c both hold, whether j's prototype of c is j's prototype nearest to i's of c (by
  cosine), against chance (1 over the classes j holds); with the mean cosine of i's c to
  j's c and to j's other counts;
* **where accuracy stops**: each method's mean accuracy on the client's own training
  windows and on its test windows.

``BENCH_ALIGNMENT_WINDOWS`` (default 400, the job's) sets ``data.samples_per_client``;
``BENCH_ALIGNMENT_SEEDS`` (default ``0,1``) the seeds.

    python -m benchmarks.bench_prototype_alignment [--quick]   # quick: seed 0, 3 rounds
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.common import bench_main, log

if TYPE_CHECKING:
    from mqttfl.algorithms.base import Downlinks, Upload

ROUNDS_SEEN = (1, 5, 10)
TAU = 0.5  # configs/fedapa-csi.toml's [method] tau


def _alignment(bodies: list[Any], num_classes: int, dim: int) -> dict[str, float]:
    from mqttfl.algorithms.fedapa.equations import similarity_weights

    n = len(bodies)
    prototypes = np.zeros((n, num_classes, dim), np.float32)
    held = np.zeros((n, num_classes), bool)
    for row, body in enumerate(bodies):
        classes = np.asarray(body["classes"], np.int64)
        prototypes[row, classes] = body["prototypes"]
        held[row, classes] = True
    alpha = similarity_weights(prototypes, held, TAU)
    own = [alpha[c, i, i] for i in range(n) for c in range(num_classes) if held[i, c]]
    unit = prototypes / np.maximum(np.linalg.norm(prototypes, axis=2, keepdims=True), 1e-12)
    nearest, same, other, chance = [], [], [], []
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            for c in np.flatnonzero(held[i] & held[j]):
                cosine = unit[j] @ unit[i, c]
                rest = [cosine[k] for k in np.flatnonzero(held[j]) if k != c]
                if rest:
                    nearest.append(cosine[c] > max(rest))
                    same.append(cosine[c])
                    other.append(float(np.mean(rest)))
                    chance.append(1 / int(held[j].sum()))
    return {
        "own_weight": float(np.mean(own)),
        "same_count_nearest": float(np.mean(nearest)),
        "chance": float(np.mean(chance)),
        "cos_same_count": float(np.mean(same)),
        "cos_other_counts": float(np.mean(other)),
    }


def _one_seed(seed: int, windows: int, quick: bool) -> dict[str, Any]:
    import torch

    from benchmarks.bench_sessions import SOURCES, federate, load
    from mqttfl.algorithms.fedapa.server import FedAPAServer

    torch.set_num_threads(1)
    extra = [f"data.samples_per_client={windows}"]
    if quick:
        extra += ["rounds=3", "method.warmup_rounds=2"]
    config, federations = load(SOURCES["default"], seed, "window", extra)
    shards = federations[0]
    seen = {*ROUNDS_SEEN, config.rounds}
    kept: dict[int, list[Any]] = {}
    aggregate = FedAPAServer.aggregate

    def keeping(
        self: FedAPAServer,
        t: int,
        uploads: list[Upload],
        staleness: Mapping[str, float] | None = None,
    ) -> Downlinks:
        if t in seen:
            kept[t] = [u.body for u in uploads]
        return aggregate(self, t, uploads, staleness)

    row: dict[str, Any] = {"seed": seed, "windows": windows}
    FedAPAServer.aggregate = keeping  # type: ignore[method-assign]
    try:
        for method in ("local", "fedapa"):
            result = federate(config, shards, method)
            train = [
                float(np.mean(side.predict(shards[c].x_train) == shards[c].y_train))
                for c, side in result.sides.items()
            ]
            row[method] = {
                "train": 100 * statistics.fmean(train),
                "test": 100 * statistics.fmean(result.accuracy.values()),
            }
    finally:
        FedAPAServer.aggregate = aggregate  # type: ignore[method-assign]
    size = (config.model.num_classes, config.model.embed_dim)
    row["rounds"] = {str(t): _alignment(kept[t], *size) for t in sorted(kept)}
    row["train_windows_per_class"] = statistics.fmean(
        len(s.y_train) / len(np.unique(s.y_train)) for s in shards.values()
    )
    log(
        f"seed {seed}, {windows} windows: local {row['local']}, fedapa {row['fedapa']}, "
        f"last round {row['rounds'][str(config.rounds)]}"
    )
    return row


def run(quick: bool) -> dict[str, Any]:
    windows = int(os.environ.get("BENCH_ALIGNMENT_WINDOWS", "400"))
    listed = os.environ.get("BENCH_ALIGNMENT_SEEDS", "0,1")
    seeds = [0] if quick else [int(s) for s in listed.split(",") if s]
    rows = [_one_seed(seed, windows, quick) for seed in seeds]
    return {
        "config": "configs/fedapa-csi.toml",
        "split": "window",
        "windows_per_client": windows,
        "tau": TAU,
        "seeds": rows,
    }


if __name__ == "__main__":
    bench_main("prototype_alignment", __doc__ or "", run)
