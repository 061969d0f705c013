"""FedAPA's bounded downlink against exact Eq. 10: accuracy at N=100 clients, paired seeds.

Whether the bounded downlink (a stratified sample of the N prototype sets,
int8, instead of all of them) costs accuracy, on a job where L_c matters, with an
interval narrow enough to see a 2-point loss. In process (each client's and the server's
own FedAPA code, no broker: :func:`benchmarks.bench_sessions.federate`), the same seeds
for every variant, so the comparison is paired:

- ``exact``: every client receives all N padded sets (``method.max_peer_sets`` above N);
- ``bounded``: the shipped default, 40 strata as int8 (``method.max_peer_sets=8``);
- ``no L_c``: FedAPA without the client-prototype term (``use_client_prototypes=false``),
  the check that L_c moves accuracy on this job at all.

The job: FedAPA on 100 clients of sklearn's 8x8 digits (configs/digits-smoke.toml grown to
N=100: Dirichlet β = 0.5, ~14 training images per client, the CNN with d=128), 10 rounds
of one local epoch warming up over 5, with λ_max = 4: data-poor clients, where the other
clients' prototypes in L_c carry information a client's own few images lack. Where L_c
moves nothing no error of its approximation can show, and probes found such jobs at the
shipped λ_max = 1: removing L_c moved accuracy by at most +0.8 points on the simulated
rooms at N=24 (both splits), MNIST at N=100, and these digits (2 seeds each); here, at
λ_max = 4, by +3.5 and +0.8 on seeds 0 and 1. The ``no L_c`` variant measures it on
every seed. Reported per variant: mean client accuracy per seed; per pair, the per-seed
difference and its mean with a 95% t interval.

    python -m benchmarks.bench_fedapa_bounded_accuracy [--quick]   # N=100, seeds 0-9; quick: N=24, 2 seeds
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.bench_sessions import config_shards, federate
from benchmarks.common import bench_main, log

CONFIG = "configs/digits-smoke.toml"
JOB = [
    "rounds=10",
    "method.warmup_rounds=5",
    "train.local_epochs=1",
    "method.lambda_max=4",
]
VARIANTS: dict[str, list[str]] = {
    "exact": ["method.max_peer_sets=100000"],
    "bounded": [],
    "no L_c": ["method.use_client_prototypes=false"],
}
#: two-sided 95% Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% t interval half-width of ``values``."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "half_width": float("nan")}
    half = T95[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": mean, "half_width": half, "low": mean - half, "high": mean + half}


def run(quick: bool) -> dict[str, Any]:
    import torch

    from mqttfl.config import load_config

    torch.set_num_threads(1)
    clients, seeds = (24, [0, 1]) if quick else (100, list(range(10)))
    accuracy: dict[str, list[float]] = {name: [] for name in VARIANTS}
    down: dict[str, float] = {}
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for seed in seeds:
        base = [*JOB, f"federation.num_clients={clients}", f"seed={seed}"]
        shards = config_shards(load_config(CONFIG, base), "window")[0]  # images: no sessions
        for name, extra in VARIANTS.items():
            config = load_config(CONFIG, [*base, *extra])
            start = time.perf_counter()
            result = federate(config, shards, "fedapa")
            seconds[name].append(time.perf_counter() - start)
            accuracy[name].append(100.0 * statistics.fmean(result.accuracy.values()))
            down[name] = result.down
            log(f"seed {seed} {name}: {accuracy[name][-1]:.2f} % ({seconds[name][-1]:.0f} s)")

    def paired(a: str, b: str) -> dict[str, Any]:
        diffs = [x - y for x, y in zip(accuracy[a], accuracy[b], strict=True)]
        return {"per_seed": diffs, **interval(diffs)}

    return {
        "config": CONFIG,
        "overrides": JOB,
        "clients": clients,
        "seeds": seeds,
        "variants": {
            name: {
                "overrides": VARIANTS[name],
                "accuracy_per_seed": accuracy[name],
                "accuracy": interval(accuracy[name]),
                "down_bytes_per_client_round": down[name],
                "median_seconds": statistics.median(seconds[name]),
            }
            for name in VARIANTS
        },
        "bounded_minus_exact": paired("bounded", "exact"),
        "exact_minus_no_lc": paired("exact", "no L_c"),
    }


if __name__ == "__main__":
    bench_main("fedapa_bounded_accuracy", "FedAPA bounded against exact, N=100", run)
