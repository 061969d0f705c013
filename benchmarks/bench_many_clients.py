"""Many client processes on one machine: the default job with 200 clients.

    python -m benchmarks.bench_many_clients [--quick]

`mqttfl run` forks every client from one `mqttfl clients` parent that imported torch
once. This runs the default job with ``federation.num_clients=200`` (small shards: 40
windows a client, 3 rounds, no Local reference), kills one client with ``kill -9``
after round 1 and checks that the coordinator saw its last will and that every round
closed. Beside it, in the same run, 20 clients started as separate `mqttfl client`
processes (what `mqttfl run` did before) on the same job. Memory is PSS (proportional
set size: a page shared by k processes counts 1/k to each; RSS would count it k
times), summed over the client processes (and the forking parent), read from
/proc/<pid>/smaps_rollup every few seconds; the figure is the peak of the sum.
``--quick``: 40 forked clients. Results: benchmarks/results/many_clients.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, WORK, bench_main, children_of, log, pss_mb, read_jsonl, stats
from mqttfl.provisioning.local_broker import LocalBroker

CONFIG = "configs/fedapa-csi.toml"
SMALL = [
    "method=fedapa",
    "data.samples_per_client=40",
    "rounds=3",
    "federation.round_timeout_s=300",
]
SAMPLE_EVERY_S = 3.0


def _forked(count: int) -> dict[str, Any]:
    """`mqttfl run` with ``count`` forked clients; one killed after round 1."""
    work = WORK / "many_clients" / f"forked-{count}"
    argv = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--plain", "--no-local-reference"]
    argv += ["--out", str(work)]
    for item in [*SMALL, f"federation.num_clients={count}", "federation.join_timeout_s=600"]:
        argv += ["--set", item]
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(work.parent / f"forked-{count}.out", "wb") as handle:
        run = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    totals: list[float] = []
    per_client: list[float] = []
    killed: int | None = None
    victim = str(count // 2)
    logs = work / "logs"
    while run.poll() is None:
        parents = [p for p in children_of(run.pid) if _comm(p) != "mosquitto"]
        forker = next((p for p in parents if " -m mqttfl clients " in _cmdline(p)), None)
        if forker is not None:
            clients = children_of(forker)
            sizes = [s for s in (pss_mb(p) for p in clients) if s is not None]
            parent_pss = pss_mb(forker) or 0.0
            if sizes:
                totals.append(sum(sizes) + parent_pss)
                if len(sizes) == count:
                    per_client = sizes
            closed = [
                e for e in read_jsonl(logs / "coordinator.jsonl") if e["event"] == "round.closed"
            ]
            if killed is None and closed:
                pid = _pid_of(logs, victim)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
        time.sleep(SAMPLE_EVERY_S)
    events = read_jsonl(logs / "coordinator.jsonl")
    offline = [e for e in events if e["event"] == "client.offline" and e.get("client") == victim]
    summary_path = work / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {
        "clients": count,
        "exit_code": run.returncode,
        "rounds_completed": summary.get("rounds_completed"),
        "wall_s": round(time.monotonic() - began, 1),
        "peak_total_pss_mb": round(max(totals), 1) if totals else None,
        "pss_per_client_mb": stats(per_client),
        "killed_client": victim if killed else None,
        "its_last_will_seen": bool(offline) and offline[0].get("reason") == "connection lost",
    }


def _separate(count: int) -> dict[str, Any]:
    """``count`` clients started as separate `mqttfl client` processes (no fork)."""
    work = WORK / "many_clients" / f"separate-{count}"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    env = {**os.environ, "MQTTFL_LOG_DIR": str(work / "logs"), "OMP_NUM_THREADS": "1"}
    with LocalBroker(work / "broker") as broker:
        common = ["--config", CONFIG, "--broker", broker.url]
        for item in [*SMALL, f"federation.num_clients={count}"]:
            common += ["--set", item]
        cli = [sys.executable, "-m", "mqttfl"]
        procs = [
            subprocess.Popen(
                [*cli, "coordinator", *common, "--out", str(work / "run")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=REPO,
            )
        ]
        clients = [
            subprocess.Popen(
                [*cli, "client", *common, "--id", str(i), "--state-dir", str(work / "state")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd=REPO,
            )
            for i in range(count)
        ]
        totals: list[float] = []
        per_client: list[float] = []
        try:
            while procs[0].poll() is None:
                sizes = [s for s in (pss_mb(p.pid) for p in clients) if s is not None]
                if sizes:
                    totals.append(sum(sizes))
                    if len(sizes) == count:
                        per_client = sizes
                time.sleep(SAMPLE_EVERY_S)
        finally:
            for proc in procs + clients:
                if proc.poll() is None:
                    proc.wait(timeout=60)
    return {
        "clients": count,
        "exit_code": procs[0].returncode,
        "peak_total_pss_mb": round(max(totals), 1) if totals else None,
        "pss_per_client_mb": stats(per_client),
    }


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _pid_of(logs: Path, client: str) -> int | None:
    for path in logs.glob("clients-*.jsonl"):
        for event in read_jsonl(path):
            if event.get("event") == "client.forked" and event.get("client") == client:
                return int(event["pid"])
    return None


def run(quick: bool) -> dict[str, Any]:
    count = 40 if quick else 200
    log(f"{count} forked clients (mqttfl run)")
    forked = _forked(count)
    log(f"  {forked}")
    log("20 separate client processes")
    separate = _separate(20)
    log(f"  {separate}")
    per_forked = forked["pss_per_client_mb"].get("median")
    per_separate = separate["pss_per_client_mb"].get("median")
    return {
        "job": f"{CONFIG} with {', '.join(SMALL)}",
        "forked": forked,
        "separate": separate,
        "pss_per_client_ratio_forked_to_separate": (
            round(per_forked / per_separate, 3) if per_forked and per_separate else None
        ),
        "goal_200_complete": forked["exit_code"] == 0 and forked["rounds_completed"] == 3,
    }


if __name__ == "__main__":
    bench_main("many_clients", __doc__.split("\n")[0], run)
