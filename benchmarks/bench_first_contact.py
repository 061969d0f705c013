"""First contact: the default job's wall time on an idle machine and beside a CPU hog.

`mqttfl run configs/fedapa-csi.toml --plain` as a new user runs it (a fresh reference
cache, so the Local reference is trained, not reused), in four settings:

* ``idle``: nothing else of ours runs (the machine's own load is recorded with the result);
* ``loaded``: two busy-loop processes (one per core on the 2-core CI machine) at the
  same niceness run beside it the whole time, as "another CPU-bound job holding both
  cores";
* each of them with the children's thread pools as `mqttfl run` now sizes them
  (``per-process``: OMP/OpenBLAS/MKL threads = ``train.torch_threads``) and as they were
  (``machine``: the pools sized to every core, ``OMP_NUM_THREADS`` etc. = the core count).

Per run: wall seconds, the CPU seconds of the whole process tree (user + system, from
``RUSAGE_CHILDREN``), the federation's seconds (the coordinator's ``run.started`` to
``run.finished``) and its median seconds per round (``round.closed`` to ``round.closed``),
the Local reference's seconds and its share of the wall time. Goals: idle <= 90 s, loaded
<= 180 s.

    python -m benchmarks.bench_first_contact [--quick]   # quick: 4 rounds, idle only

The default job runs idle and loaded; with ``BENCH_FIRST_CONTACT_POOLS=1`` also the
thread pools' A/B (``machine`` against ``per-process``) beside the hog at 4 rounds
(``SHORT``). ``BENCH_FIRST_CONTACT_SET="method=fedapa-session"`` (``--set`` items,
space-separated) runs the job changed so, and writes ``first_contact-<items>.json``.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import WORK, bench_main, event_time, log, read_jsonl

CONFIG = "configs/fedapa-csi.toml"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
GOALS_S = {"idle": 90.0, "loaded": 180.0}
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _hogs(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)]) for _ in range(count)
    ]


def _federation(out: Path) -> dict[str, Any]:
    events = read_jsonl(out / "logs" / "coordinator.jsonl")
    started = [event_time(e) for e in events if e.get("event") == "run.started"]
    finished = [event_time(e) for e in events if e.get("event") == "run.finished"]
    closed = sorted(event_time(e) for e in events if e.get("event") == "round.closed")
    gaps = [b - a for a, b in itertools.pairwise(closed)]
    return {
        "federation_s": round(finished[-1] - started[0], 1) if started and finished else None,
        "rounds": len(closed),
        "median_round_s": round(statistics.median(gaps), 2) if gaps else None,
    }


def run_once(load: str, threads: str, overrides: list[str], out: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if threads == "machine":
        env.update(dict.fromkeys(THREAD_VARIABLES, str(os.cpu_count() or 1)))
    cache = Path(tempfile.mkdtemp(prefix="mqttfl-bench-cache-"))
    env["MQTTFL_CACHE_DIR"] = str(cache)  # a new user's: the reference is trained
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--plain", "--out", str(out)]
    for item in [*CHANGES, *overrides]:
        command += ["--set", item]
    hogs = _hogs(2, 900) if load == "loaded" else []
    try:
        cpu0, began = _cpu_seconds(), time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - began
        cpu = _cpu_seconds() - cpu0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"mqttfl run failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    reference = summary.get("local_reference") or {}
    row = {
        "load": load,
        "threads": threads,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        **_federation(out),
        "reference_s": reference.get("seconds"),
        "reference_share": round(float(reference["seconds"]) / wall, 3) if reference else None,
        "goal_s": GOALS_S[load],
        "within_goal": wall <= GOALS_S[load],
        "accuracy": summary["mean"]["accuracy"],
        "local_accuracy": reference.get("mean", {}).get("accuracy"),
        "gain": reference.get("gain", {}).get("mean"),
        "table": done.stdout.split("\n", 1)[-1].strip().splitlines()[-14:],
    }
    log(
        f"{load:>6} {threads:>11}: {row['wall_s']} s wall, {row['cpu_s']} s CPU, "
        f"{row['median_round_s']} s/round, reference {row['reference_s']} s"
    )
    return row


SHORT = ["rounds=4", "method.warmup_rounds=2"]


#: ``--set`` items every run of this invocation adds (the module docstring)
CHANGES = os.environ.get("BENCH_FIRST_CONTACT_SET", "").split()


def run(quick: bool) -> dict[str, Any]:
    # The default job idle and loaded; the thread pools' A/B beside the hog at 4 rounds.
    plan: list[tuple[str, str, list[str]]] = (
        [("idle", "per-process", SHORT)]
        if quick
        else [
            ("idle", "per-process", []),
            ("loaded", "per-process", []),
            *(
                [("loaded", "machine", SHORT), ("loaded", "per-process", SHORT)]
                if os.environ.get("BENCH_FIRST_CONTACT_POOLS")
                else []
            ),
        ]
    )
    rows = []
    for load, threads, overrides in plan:
        size = "short" if overrides else "default"
        out = WORK / f"first-contact-{load}-{threads}-{size}"
        rows.append({"size": size, **run_once(load, threads, overrides, out)})
    by = {(r["load"], r["threads"], r["size"]): r for r in rows}
    ratios: dict[str, Any] = {}
    idle = by.get(("idle", "per-process", "default"))
    loaded = by.get(("loaded", "per-process", "default"))
    if idle and loaded:
        ratios["default job, loaded / idle"] = round(loaded["wall_s"] / idle["wall_s"], 2)
    machine = by.get(("loaded", "machine", "short"))
    own = by.get(("loaded", "per-process", "short"))
    if machine and own:
        ratios["4 rounds loaded, machine-sized pools / per-process"] = {
            "wall": round(machine["wall_s"] / own["wall_s"], 2),
            "cpu": round(machine["cpu_s"] / own["cpu_s"], 2),
        }
    return {
        "config": CONFIG,
        "changes": CHANGES,
        "short_overrides": SHORT,
        "load": "two busy-loop processes (python, same niceness) for the whole run",
        "runs": rows,
        "ratios": ratios,
    }


if __name__ == "__main__":
    bench_main(
        "-".join(["first_contact", *(c.replace("=", "-") for c in CHANGES)]),
        __doc__ or "",
        run,
        command=" ".join(
            [
                *([f'BENCH_FIRST_CONTACT_SET="{" ".join(CHANGES)}"'] if CHANGES else []),
                "python -m benchmarks.bench_first_contact",
            ]
        ),
    )
