"""Many real clients: a 200-client training federation in fleets, and FedAPA exact against
bounded downlinks on a federation large enough for them to differ.

- ``federation``: ``mqttfl run configs/fedapa-csi.toml --fleets K`` with 200 clients
  (TinyConvNet4, small synthetic CSI shards): every client a real runner with its own MQTT
  session, state directory and shard, trained through the fleets' worker pools. Measured
  from outside: join time (launch -> the coordinator's ``clients.joined``), each round's
  time (the coordinator's ``round.closed``), and the peak RSS (VmHWM) of every process of
  the job, sampled from /proc every 0.2 s, plus the peak of their sum. Goals: coordinator
  RSS <= 150 MB; the whole job within the machine's 24 GB.
- ``accuracy``: FedAPA with exact P (``max_peer_sets`` above N) against the bounded
  downlink (k=8) on the default job (LargeConvNet4, synthetic CSI rooms) grown to 36
  clients, 20 rounds, 3 seeds; mean accuracy over clients (last five rounds, as every
  summary reports it).

    [BENCH_FLEET_ONLY=federation|accuracy] python -m benchmarks.bench_fleet [--quick]
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, RESULTS, WORK, bench_main, event_time, log, read_jsonl

CONFIG = "configs/fedapa-csi.toml"
SMALL = [  # small shards on a small model: 200 runners on 2 cores
    "model.name=tiny",
    "data.samples_per_client=60",
    "data.window=32",
    "federation.round_timeout_s=600",
    "federation.join_timeout_s=600",
    "federation.final_metrics_timeout_s=60",
]
COORDINATOR_GOAL_MB = 150.0
MACHINE_GB = 24.0


def _role(cmdline: str) -> str:
    for role in ("coordinator", "fleet", "client", "mosquitto"):
        if f" {role} " in f" {cmdline} " or (role == "mosquitto" and "mosquitto" in cmdline):
            return role
    return "launcher"


class MemorySampler(threading.Thread):
    """Peak RSS of a process tree: VmHWM of every process, and the peak of the sum of VmRSS."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, kB)
        self.total_peak_kb = 0
        self.stop = threading.Event()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        return tree

    def run(self) -> None:
        while not self.stop.is_set():
            total = 0
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                hwm = int(fields.get("VmHWM", "0 kB").split()[0])
                total += int(fields.get("VmRSS", "0 kB").split()[0])
                role = _role(cmd)
                if hwm > self.peaks.get(pid, (role, 0))[1]:
                    self.peaks[pid] = (role, hwm)
            self.total_peak_kb = max(self.total_peak_kb, total)
            time.sleep(self.interval)


def _mqttfl_run(out: Path, overrides: list[str], fleets: int | None) -> tuple[dict[str, Any], Any]:
    cmd = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--out", str(out)]
    cmd += [arg for item in ["method=fedapa", *overrides] for arg in ("--set", item)]
    if fleets:
        cmd += ["--fleets", str(fleets)]
    began = time.time()
    with open(out.parent / f"{out.name}.console", "wb") as console:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=console, stderr=subprocess.STDOUT)
        sampler = MemorySampler(process.pid)
        sampler.start()
        code = process.wait(timeout=3600)
        sampler.stop.set()
        sampler.join()
    if code != 0:
        raise RuntimeError(f"mqttfl run exited {code}; see {out.parent / (out.name + '.console')}")
    summary = json.loads((out / "summary.json").read_text())
    events = read_jsonl(out / "logs" / "coordinator.jsonl")
    joined = [event_time(e) - began for e in events if e.get("event") == "clients.joined"]
    rounds = [e["seconds"] for e in events if e.get("event") == "round.closed"]
    closed = [event_time(e) for e in events if e.get("event") == "round.closed"]
    facts = {"join_s": joined[0] if joined else None, "round_close_s": rounds, "closed": closed}
    facts["wall_s"] = time.time() - began
    return {"summary": summary, **facts}, sampler


def federation(quick: bool) -> dict[str, Any]:
    n, fleets, rounds = (40, 2, 2) if quick else (200, 4, 3)
    out = WORK / f"fleet-{n}"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"federation: {n} clients in {fleets} fleets, {rounds} rounds")
    overrides = [*SMALL, f"federation.num_clients={n}", f"rounds={rounds}", "run_id=fleet-bench"]
    facts, sampler = _mqttfl_run(out, overrides, fleets)
    by_role: dict[str, list[float]] = {}
    for role, kb in sampler.peaks.values():
        by_role.setdefault(role, []).append(kb / 1024)
    summary = facts["summary"]
    closed = facts["closed"]
    round_wall = [b - a for a, b in itertools.pairwise(closed)]
    coordinator_mb = max(by_role.get("coordinator", [0.0]))
    total_gb = sampler.total_peak_kb / 1024 / 1024
    return {
        "clients": n,
        "fleets": fleets,
        "rounds": summary["rounds_completed"],
        "overrides": overrides,
        "join_s": facts["join_s"],
        "round_wall_s": round_wall,
        "round_close_s": facts["round_close_s"],
        "wall_s": facts["wall_s"],
        "clients_reporting": len(summary["clients"]),
        "peak_rss_mb": {
            role: {"processes": len(v), "max": max(v), "median": statistics.median(v)}
            for role, v in by_role.items()
        },
        "peak_total_gb": total_gb,
        "goals": [
            {
                "goal": "coordinator RSS <= 150 MB",
                "figure_mb": coordinator_mb,
                "met": coordinator_mb <= COORDINATOR_GOAL_MB,
            },
            {
                "goal": "whole job within 24 GB",
                "figure_gb": total_gb,
                "met": total_gb <= MACHINE_GB,
            },
        ],
    }


def accuracy(quick: bool) -> dict[str, Any]:
    n, rounds, seeds = (12, 4, (0,)) if quick else (36, 20, (0, 1, 2))
    # The default job (LargeConvNet4, 400 samples per room) at 36 clients; T_warm=10 so λ
    # holds λ_max for the second half of the run.
    job = [
        "federation.round_timeout_s=900",
        "federation.join_timeout_s=600",
        "federation.final_metrics_timeout_s=60",
        "method.warmup_rounds=10" if not quick else "method.warmup_rounds=2",
        *(SMALL if quick else []),
    ]
    variants = {"exact": ["method.max_peer_sets=100000"], "bounded (k=8)": []}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for seed in seeds:
        for name, extra in variants.items():
            out = WORK / f"fedapa-{n}-{name.split()[0]}-{seed}"
            if out.exists():
                import shutil

                shutil.rmtree(out)
            overrides = [
                *job,
                f"federation.num_clients={n}",
                f"rounds={rounds}",
                f"seed={seed}",
                "run_id=fedapa-scale",
                *extra,
            ]
            log(f"accuracy: FedAPA {name}, N={n}, seed {seed}")
            facts, _ = _mqttfl_run(out, overrides, fleets=2)
            summary = facts["summary"]
            rows[name].append(
                {
                    "seed": seed,
                    "accuracy": summary["mean"]["accuracy"],
                    "f1": summary["mean"]["f1"],
                    "down_kb_per_client_round": summary["comm"]["down_bytes_per_client_round"]
                    / 1000,
                    "wall_s": facts["wall_s"],
                }
            )
    table = {
        name: {
            "accuracy_mean": statistics.fmean(r["accuracy"] for r in v),
            "accuracy_sd": statistics.pstdev(r["accuracy"] for r in v),
            "down_kb_per_client_round": statistics.fmean(r["down_kb_per_client_round"] for r in v),
            "runs": v,
        }
        for name, v in rows.items()
    }
    return {"clients": n, "rounds": rounds, "seeds": list(seeds), "job": job, "table": table}


def run(quick: bool) -> dict[str, Any]:
    only = os.environ.get("BENCH_FLEET_ONLY", "")
    out: dict[str, Any] = {}
    previous = RESULTS / f"fleet{'-quick' if quick else ''}.json"
    if only and previous.exists():  # one part again: keep the other's last figures
        kept = json.loads(previous.read_text())
        out = {part: kept[part] for part in ("federation", "accuracy") if part in kept}
    if only in ("", "federation"):
        out["federation"] = federation(quick)
    if only in ("", "accuracy"):
        out["accuracy"] = accuracy(quick)
    return out


if __name__ == "__main__":
    bench_main("fleet", __doc__.splitlines()[0], run)
