"""FedAPA aggregation time against N, with the personalized Q_i of every client.

C=21 classes, d=256, N = 10, 100, 1000 clients; every client lacks ~10% of its classes
(so Eq. 8's padding runs too). Timed: ``FedAPAServer.aggregate`` on validated uploads
(stacking, Eqs. 5-8 for all clients, building every personal downlink body) and, alone,
the vectorized core ``aggregate_prototypes``. Wall time (median, min) and the process's
CPU time per call, measured in a fresh process with the BLAS thread pool at its default
(all cores, as the coordinator runs) and again limited to one thread (OpenBLAS threads
busy-wait, which costs a lot on a machine that is busy with other work).
Goal: at most 200 ms at N=1000 (default threads).

    python -m benchmarks.bench_aggregation [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, cast

import numpy as np

from benchmarks.common import REPO, child_process_main, log, stats

SIZES = (10, 100, 1000)
CLASSES, DIM = 21, 256
GOAL_S = 0.200  # at N=1000


def make_uploads(n: int, seed: int = 0) -> list[Any]:
    from mqttfl.algorithms.base import Upload
    from mqttfl.wire.schemas import ClientInfo

    rng = np.random.default_rng(seed)
    uploads = []
    for i in range(n):
        present = np.flatnonzero(rng.random(CLASSES) < 0.9)
        if present.size == 0:
            present = np.array([i % CLASSES])
        info = ClientInfo(str(i), "large", tuple(int(c) for c in present), 100, (1, 64, 242))
        body = {
            "classes": present.astype(np.int64),
            "prototypes": rng.standard_normal((present.size, DIM)).astype(np.float32),
            "counts": rng.integers(1, 50, present.size).astype(np.int64),
        }
        uploads.append(Upload(str(i), info, body))
    return uploads


def _time(fn: Any, repeats: int) -> tuple[list[float], list[float]]:
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def measure(quick: bool) -> list[dict[str, Any]]:
    from mqttfl.algorithms import get_algorithm
    from mqttfl.algorithms.base import Context
    from mqttfl.algorithms.common.prototype_uploads import stack_uploads
    from mqttfl.algorithms.fedapa import aggregate_prototypes
    from mqttfl.algorithms.fedapa.downlinks import Personal

    algorithm = get_algorithm("fedapa")
    ctx = Context(num_classes=CLASSES, embed_dim=DIM, rounds=50, seed=0, params=algorithm.params())
    server = algorithm.server(ctx)
    rows = []
    for n in SIZES:
        repeats = (3 if quick else 9) if n >= 1000 else (5 if quick else 21)
        uploads = make_uploads(n)
        protos, mask = stack_uploads(uploads, CLASSES, DIM)
        downlinks = server.aggregate(1, uploads)
        assert len(downlinks.personal) == n
        assert cast("Personal", downlinks.personal["0"])["q"].shape == (CLASSES, DIM)
        full_wall, full_cpu = _time(lambda uploads=uploads: server.aggregate(1, uploads), repeats)
        core_wall, core_cpu = _time(
            lambda protos=protos, mask=mask: aggregate_prototypes(protos, mask, tau=ctx.params.tau),
            repeats,
        )
        rows.append(
            {
                "n": n,
                "repeats": repeats,
                "server_aggregate_s": stats(full_wall),
                "server_aggregate_cpu_s": stats(full_cpu),
                "core_s": stats(core_wall),
                "core_cpu_s": stats(core_cpu),
            }
        )
        log(
            f"aggregation N={n}: server.aggregate median {stats(full_wall)['median'] * 1000:.1f} ms"
        )
    return rows


def _child(quick: bool, threads: int | None) -> list[dict[str, Any]]:
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
        if threads is not None:
            env[name] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench_aggregation",
        "--child",
        *(["--quick"] if quick else []),
    ]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=True, cwd=REPO, timeout=1800
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def run(quick: bool) -> dict[str, Any]:
    rows = _child(quick, None)
    single = _child(quick, 1)
    at_goal = next(r for r in rows if r["n"] == 1000)["server_aggregate_s"]["median"]
    return {
        "what": "FedAPAServer.aggregate (Eqs. 5-8, personalized Q for every client) and its core "
        f"aggregate_prototypes, C={CLASSES}, d={DIM}",
        "goal": {
            "text": "at most 200 ms at N=1000",
            "limit_s": GOAL_S,
            "figure_s": at_goal,
            "met": at_goal <= GOAL_S,
        },
        "blas_threads": "default (all cores)",
        "sizes": rows,
        "single_thread_sizes": single,
    }


def main() -> None:
    child_process_main("aggregation", "FedAPA aggregation benchmark", measure, run)


if __name__ == "__main__":
    main()
