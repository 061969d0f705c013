"""Does every method learn? The measured runs behind the end-to-end tests' margins.

Each registered method runs `mqttfl run configs/digits-smoke.toml` (3 clients, 3 rounds,
real processes over a local Mosquitto) for seeds 0-2, FedAli on the transformer it needs.
Per run: the last round's accuracy per client, and each client's majority-class share of
its test split (what always answering its most common label scores, the chance level of
a label-skewed client). tests/test_methods_e2e.py asserts a floor well below the worst
run measured here and well above the highest majority share.

    python -m benchmarks.bench_learning [--quick]   # quick: seed 0 only
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import WORK, bench_main, log, read_jsonl

CONFIG = "configs/digits-smoke.toml"


def method_overrides(method: str) -> list[str]:
    """The ``--set`` items a method needs on the smoke config (FedAli: its transformer)."""
    items = [f"method={method}"]
    if method == "fedali":
        items += ["model.name=transformer", "model.embed_dim=64", "method.prototype_counts=[16, 8]"]
    return items


def majority_shares(seed: int) -> dict[str, float]:
    """Each client's most common test label's share of its test split."""
    from mqttfl.config import load_config
    from mqttfl.data.sources import load_client_shard

    config = load_config(CONFIG, [f"seed={seed}"])
    shares = {}
    for client in range(config.federation.num_clients):
        shard = load_client_shard(
            config.data,
            str(client),
            seed=seed,
            num_classes=config.model.num_classes,
            num_clients=config.federation.num_clients,
        )
        counts = np.bincount(shard.y_test, minlength=config.model.num_classes)
        shares[str(client)] = float(counts.max() / counts.sum())
    return shares


def _run(method: str, seed: int) -> dict[str, Any]:
    out = WORK / "learning" / method / f"seed-{seed}"
    sets = [*method_overrides(method), f"seed={seed}"]
    command = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--plain", "--out", str(out)]
    command += ["--no-local-reference"]
    for item in sets:
        command += ["--set", item]
    start = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - start
    records = read_jsonl(out / "metrics.jsonl")
    last = max(int(r["round"]) for r in records)
    final = {str(r["client_id"]): float(r["accuracy"]) for r in records if r["round"] == last}
    return {"seed": seed, "seconds": round(seconds, 1), "final": final}


def run(quick: bool) -> dict[str, Any]:
    from mqttfl.algorithms import algorithm_names

    seeds = [0] if quick else [0, 1, 2]
    chance = {seed: majority_shares(seed) for seed in seeds}
    methods: dict[str, Any] = {}
    for method in algorithm_names():
        runs = []
        for seed in seeds:
            log(f"{method} seed {seed}")
            runs.append(_run(method, seed))
        worst = min(min(r["final"].values()) for r in runs)
        means = [statistics.fmean(r["final"].values()) for r in runs]
        methods[method] = {
            "runs": runs,
            "worst_client": worst,
            "mean_accuracy": statistics.fmean(means),
            "worst_mean": min(means),
        }
        log(f"  worst client {worst:.3f}, mean {statistics.fmean(means):.3f}")
    return {
        "config": CONFIG,
        "seeds": seeds,
        "majority_share": chance,
        "highest_majority_share": max(max(c.values()) for c in chance.values()),
        "methods": methods,
    }


if __name__ == "__main__":
    bench_main("learning", __doc__.splitlines()[0] if __doc__ else "learning", run)
