"""FedAPA-S's settings chosen without looking at the clients they are scored on.

docs/sessions.md chose FedAPA-S's settings (no L_c, test-time BatchNorm statistics,
k-means from Q_i, 5 steps) from the diagnosis on ESPectre's test sessions: selection on
test data. Leave-one-session-out validation inside a client's training sessions cannot
replace it there, since under the session split ESPectre's chips hold one training day
(one session per label). This benchmark measures the selection's optimism instead, by
nested leave-one-client-out: every variant below runs on the source's federations
(in process, :func:`benchmarks.bench_sessions.federate`, seeds 0-2); for each client c,
the variant with the best mean accuracy over the *other* clients' test sessions is
chosen, and c is scored with it. The mean of those scores is an estimate whose
selection never saw the scored client's test session, beside the shipped default's.
``all_sources`` does the same over the clients of every source together (one setting
for a deployment that does not know which kind of source it is).

    python -m benchmarks.bench_session_selection [--quick]   # quick: seed 0, 3 rounds

``BENCH_SELECTION_SOURCES=espectre,intel5300-file`` names the sources (bench_sessions').
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.bench_sessions import SOURCES, federate, load
from benchmarks.common import bench_main, log

#: variant -> ``method.*`` overrides of fedapa-session (the first is the shipped default)
VARIANTS: dict[str, list[str]] = {
    "default (k-means 5 steps)": [],
    "nearest Q_i (0 steps)": ["method.refine_steps=0"],
    "k-means 20 steps": ["method.refine_steps=20"],
    "classifier head": ["method.inference=head"],
    "no test-time statistics": ["method.adapt_norm=false"],
    "with L_c": ["method.use_client_prototypes=true"],
}


def nested_choice(scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``scores[variant][client]`` (mean over seeds) -> per client the variant chosen on
    the other clients and that variant's score on it; and their mean."""
    clients = sorted(next(iter(scores.values())))
    chosen: dict[str, str] = {}
    for client in clients:
        others = [c for c in clients if c != client]
        chosen[client] = max(scores, key=lambda v: statistics.fmean(scores[v][c] for c in others))
    held_out = {c: scores[chosen[c]][c] for c in clients}
    return {"chosen": chosen, "scores": held_out, "mean": statistics.fmean(held_out.values())}


def run(quick: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    seeds = [0] if quick else [0, 1, 2]
    names = [s for s in os.environ.get("BENCH_SELECTION_SOURCES", "").split(",") if s]
    results: dict[str, Any] = {}
    for name in names or ["espectre", "intel5300-file"]:
        source = SOURCES[name]
        extra = source.quick if quick else []
        per_client: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
        for variant, overrides in VARIANTS.items():
            start = time.perf_counter()
            for seed in seeds:
                config, federations = load(source, seed, "session", [*extra, *overrides])
                for index, shards in enumerate(federations):
                    result = federate(config, shards, "fedapa-session")
                    for client, accuracy in result.accuracy.items():
                        key = f"{index}:{client}"
                        per_client[variant].setdefault(key, []).append(100.0 * accuracy)
            log(f"{name} {variant}: {time.perf_counter() - start:.0f} s")
        scores = {v: {c: statistics.fmean(a) for c, a in s.items()} for v, s in per_client.items()}
        default = next(iter(VARIANTS))
        results[name] = {
            "note": source.note,
            "per_client": per_client,
            "variant_means": {v: statistics.fmean(s.values()) for v, s in scores.items()},
            "default": statistics.fmean(scores[default].values()),
            "nested": nested_choice(scores),
        }
        log(f"{name}: default {results[name]['default']:.1f}, nested {results[name]['nested']}")
    # One setting for every source: chosen on the other clients of all sources together.
    pooled = {
        v: {
            f"{name}:{client}": statistics.fmean(accuracies)
            for name, entry in results.items()
            for client, accuracies in entry["per_client"][v].items()
        }
        for v in VARIANTS
    }
    return {
        "split": "session",
        "seeds": seeds,
        "variants": VARIANTS,
        "sources": results,
        "all_sources": nested_choice(pooled),
    }


if __name__ == "__main__":
    bench_main("session_selection", "FedAPA-S settings by nested leave-one-client-out", run)
