"""FedAPA-S's test-time rules on a new day: what each part of the adaptation is worth with
21 classes (the default job's rooms) and with two (ESPectre's presence), and how far the
day moves each class's windows from the federation's prototypes.

One FedAPA-S federation per source and seed (session split, in process:
:func:`benchmarks.bench_sessions.federate`; the default job as shipped, ESPectre as
bench_sessions runs it), then every client's test day classified by each rule, from the
same trained model and Q_i:

- ``head``: the trained classifier head, nothing adapted;
- ``adapted_head``: the head after the day's BatchNorm statistics (AdaBN);
- ``adapted_nearest``: the nearest Q_i (cosine) after AdaBN;
- ``adapted_kmeans``: the cosine k-means from Q_i after AdaBN (FedAPA-S's rule, 5 steps);
- ``shipped``: FedAPA-S's prediction (the shift gate picks ``head`` or ``adapted_kmeans``).

Then two figures that read the test labels, so they score no rule and choose nothing:

- ``day_means``: each window named by the nearest of the test day's own class means (the
  adapted embeddings): how well one day's counts separate from each other;
- ``centres_named``: the share of the test day's classes whose mean lies nearest the Q_i of
  its own count, and ``centre_error`` the counts between them (mean |ĉ - c|).

    python -m benchmarks.bench_session_inference [--quick]   # quick: seed 0, 2 rounds

``BENCH_SESSION_INFERENCE_SOURCES=default`` runs one source.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from benchmarks.common import bench_main, log

SEEDS = (0, 1, 2)
SOURCES = ("default", "espectre")
RULES = ("head", "adapted_head", "adapted_nearest", "adapted_kmeans", "shipped")
KMEANS_STEPS = 5


def _client_figures(side: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    import torch

    from mqttfl.adaptation.refine import assign, refine_prototypes, unit_rows
    from mqttfl.algorithms.fedapa.session import renormalize
    from mqttfl.training.loops import embed_all, predict_logits

    def accuracy(labels: np.ndarray) -> float:
        return float(np.mean(labels == y))

    q = side.q.numpy()
    available = side.available.numpy().astype(bool)
    adapted = renormalize(side.model, x)
    z = embed_all(adapted, x)
    with torch.no_grad():
        adapted_head = adapted.classify(torch.from_numpy(z)).argmax(dim=1).numpy()
    kmeans, _ = refine_prototypes(z, q.copy(), available, KMEANS_STEPS)
    classes = np.unique(y)
    means = np.stack([unit_rows(z[y == c]).mean(axis=0) for c in classes])
    named = assign(means, q, available)
    return {
        "head": accuracy(predict_logits(side.model, x).argmax(axis=1)),
        "adapted_head": accuracy(adapted_head),
        "adapted_nearest": accuracy(assign(z, q, available)),
        "adapted_kmeans": accuracy(kmeans),
        "shipped": accuracy(side.predict(x)),
        "day_means": accuracy(classes[assign(z, means, np.ones(len(classes), bool))]),
        "centres_named": float(np.mean(named == classes)),
        "centre_error": float(np.mean(np.abs(named - classes))),
        "windows_per_class": len(y) / len(classes),
        "classes": float(len(classes)),
    }


def _source(name: str, quick: bool) -> dict[str, Any]:
    from benchmarks.bench_sessions import SOURCES as KNOWN
    from benchmarks.bench_sessions import federate, load

    source = KNOWN[name]
    extra = source.quick if quick else []
    per_seed: dict[str, dict[str, float]] = {}
    for seed in SEEDS[:1] if quick else SEEDS:
        config, federations = load(source, seed, "session", extra)
        clients = []
        for shards in federations:
            result = federate(config, shards, "fedapa-session")
            clients += [
                _client_figures(side, shards[cid].x_test, shards[cid].y_test)
                for cid, side in result.sides.items()
            ]
        per_seed[str(seed)] = {k: float(np.mean([c[k] for c in clients])) for k in clients[0]}
        figures = ", ".join(f"{k} {v:.3f}" for k, v in per_seed[str(seed)].items())
        log(f"{name} seed {seed}: {figures}")
    keys = next(iter(per_seed.values()))
    return {
        "config": source.config,
        "overrides": [*source.overrides, *extra],
        "seeds": per_seed,
        "mean": {k: statistics.fmean(s[k] for s in per_seed.values()) for k in keys},
    }


def run(quick: bool) -> dict[str, Any]:
    import torch

    from benchmarks.bench_sessions import _listed

    torch.set_num_threads(1)
    return {
        "what": "FedAPA-S's test-time rules on a new day (mean client accuracy per seed), "
        "and how far the day moves each class's windows from Q_i",
        "rules": list(RULES),
        "sources": {
            name: _source(name, quick)
            for name in _listed("BENCH_SESSION_INFERENCE_SOURCES", list(SOURCES))
        },
    }


def main() -> None:
    bench_main("session_inference", "FedAPA-S's test-time rules on the default job", run)


if __name__ == "__main__":
    main()
