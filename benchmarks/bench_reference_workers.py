"""The Local reference's training: a process per client against a thread per client.

The default job's shards (configs/fedapa-csi.toml), ``ROUNDS`` rounds, trained by
:func:`mqttfl.evaluation.reference.train_local_reference` in worker processes (its
default where processes fork) and in 6 worker threads of this process (``workers=6``),
alternately, ``REPEATS`` times each, beside two busy-loop processes (a CPU-bound job
holding both cores). Reported: wall seconds of each, their medians and the ratio, and
whether both gave the same metrics (they must: the comparison stays exact).

    python -m benchmarks.bench_reference_workers [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import bench_main, log

CONFIG = "configs/fedapa-csi.toml"
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def run(quick: bool) -> dict[str, Any]:
    from mqttfl.config import load_config
    from mqttfl.evaluation.pooled import client_shards
    from mqttfl.evaluation.reference import train_local_reference

    rounds, repeats = (2, 1) if quick else (5, 2)
    config = load_config(CONFIG, [f"rounds={rounds}"])
    shards = client_shards(config)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=1800)]) for _ in range(2)]
    times: dict[str, list[float]] = {"processes": [], "threads": []}
    results: dict[str, Any] = {}
    try:
        for _ in range(repeats):
            for how, workers in (("processes", None), ("threads", len(shards))):
                began = time.monotonic()
                results[how] = train_local_reference(config, shards, workers=workers)
                times[how].append(round(time.monotonic() - began, 1))
                log(f"{how}: {times[how][-1]} s")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    medians = {how: statistics.median(values) for how, values in times.items()}
    return {
        "config": CONFIG,
        "rounds": rounds,
        "load": "two busy-loop processes (python) for the whole measurement",
        "seconds": times,
        "median_s": medians,
        "threads_over_processes": round(medians["threads"] / medians["processes"], 2),
        "same_metrics": results["processes"] == results["threads"],
    }


if __name__ == "__main__":
    bench_main("reference_workers", __doc__ or "", run)
