"""What a client device pays: memory and time of one client process on one CPU.

    python -m benchmarks.bench_device [--quick]

For every shipped architecture that takes windows, on the default job (64x242 synthetic
windows) and on ESPectre (50x51 amplitudes), one client of a real 2-client federation
runs on CPU 0 (a cgroup's cpuset where the machine has one, else ``taskset``), while the
coordinator and the other client run on CPU 1. Its process is read every 0.1 s from
/proc: peak RSS (VmHWM), private memory (Private_Clean + Private_Dirty of
smaps_rollup), and RSS when it evaluates rounds 5 and 50 (no growth: within 5%). The
time from its process start to its first ``training.started`` and its median training
seconds per round come from its log. Beside each, in the same run and on the same CPU,
bare torch trains the same model on the same shard (``benchmarks.bare_torch``).

Goals: peak RSS <= 1.2x bare torch's; <= 4 s from start to the first training; RSS at
round 50 at most 5% above round 5. ``--quick`` runs 6 rounds (no growth figure);
``BENCH_DEVICE_ARCHS=tiny,middle`` measures only those.
Results: benchmarks/results/device.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import WORK, bench_main, event_time, log, read_jsonl, stats
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.testing.board import Board, unavailable

DEFAULT_JOB = "configs/fedapa-csi.toml"
ESPECTRE = "configs/presence-espectre.toml"
ARCHS = ("tiny", "middle", "large", "cnn", "transformer")
ROUNDS, QUICK_ROUNDS = 50, 6
BARE_ROUNDS = 5
GIB = 2**30


def _shared_data() -> Path:
    env = os.environ.get("MQTTFL_SHARED_DATA")
    return Path(env) if env else (Path(__file__).resolve().parents[2] / "shared" / "data")


def _jobs() -> list[tuple[str, str, list[str]]]:
    jobs: list[tuple[str, str, list[str]]] = [("default job", DEFAULT_JOB, ["method=fedapa"])]
    if (_shared_data() / "espectre").is_dir():
        jobs.append(("espectre", ESPECTRE, [f"data.path={_shared_data()}"]))
    return jobs


def _proc(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM and private MB of ``pid`` now (empty once it is gone)."""
    found: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) / 1024
        private = 0
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith(("Private_Clean", "Private_Dirty")):
                    private += int(line.split()[1])
        found["private"] = private / 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def _pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if shutil.which("taskset") else argv


@contextlib.contextmanager
def _cpu0() -> Any:
    """What runs the measured process on CPU 0: a board (cpuset) with room to spare, or
    taskset."""
    if unavailable() is None:
        with Board(16 * GIB, cpus="0") as board:
            yield board.command
    else:
        yield lambda argv: _pinned("0", argv)


def _save_shard(config: str, overrides: list[str], path: Path) -> dict[str, Any]:
    import numpy as np

    from mqttfl.config import load_config
    from mqttfl.data.sources import run_client_shard

    cfg = load_config(config, overrides)
    shard = run_client_shard(cfg, "0")
    np.savez(path, x_train=shard.x_train, y_train=shard.y_train, x_test=shard.x_test)
    train = cfg.train
    return {
        "classes": cfg.model.num_classes,
        "embed": cfg.model.embed_dim,
        "recipe": [train.lr, train.momentum, train.weight_decay, train.batch_size],
        "epochs": train.local_epochs,
        "shape": list(shard.x_train.shape),
    }


def _bare(shard: Path, arch: str, facts: dict[str, Any]) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "benchmarks.bare_torch",
        str(shard),
        arch,
        str(facts["classes"]),
        str(facts["embed"]),
        *(str(v) for v in facts["recipe"]),
        str(facts["epochs"]),
        str(BARE_ROUNDS),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with _cpu0() as wrap:
        done = subprocess.run(wrap(argv), capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        return {"error": done.stderr[-500:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _spawn(argv: list[str], out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(out, "wb") as handle:
        return subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait_for(path: Path, event: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") == event for e in read_jsonl(path)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"no {event} in {path} within {timeout:.0f} s")


def _federation(config: str, overrides: list[str], work: Path, rounds: int) -> dict[str, Any]:
    """A coordinator and client 1 on CPU 1; client 0, measured, on CPU 0."""
    logs = work / "logs"
    env = {**os.environ, "MQTTFL_LOG_DIR": str(logs), "OMP_NUM_THREADS": "1"}
    with LocalBroker(work / "broker") as broker:
        common = ["--config", config, "--broker", broker.url]
        for item in overrides:
            common += ["--set", item]
        cli = [sys.executable, "-m", "mqttfl"]
        state = ["--state-dir", str(work / "state")]
        coordinator = _spawn(
            _pinned("1", [*cli, "coordinator", *common, "--out", str(work / "run")]),
            work / "coordinator.out",
            env,
        )
        other = _spawn(
            _pinned("1", [*cli, "client", *common, "--id", "1", *state]), work / "1.out", env
        )
        procs = [coordinator, other]
        try:
            _wait_for(logs / "client-1.jsonl", "broker.connected", 120)
            with _cpu0() as wrap:
                started = time.time()
                device = _spawn(
                    wrap([*cli, "client", *common, "--id", "0", *state]), work / "0.out", env
                )
                procs.append(device)
                samples = _watch(device, logs / "client-0.jsonl", timeout=600 + 30 * rounds)
            coordinator.wait(timeout=120)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    events = read_jsonl(logs / "client-0.jsonl")
    trains = [e for e in events if e["event"] == "training.started"]
    uploads = [e for e in events if e["event"] == "upload.sent"]
    rss = samples["rss_at_round"]
    growth = None
    if 5 in rss and rounds in rss and rounds > 5:
        growth = rss[rounds] / rss[5] - 1
    return {
        "exit_code": device.returncode,
        "rounds_uploaded": len(uploads),
        "peak_rss_mb": round(samples["peak"], 1),
        "private_mb_max": round(samples["private"], 1),
        "start_to_first_training_s": (
            round(event_time(trains[0]) - started, 2) if trains else None
        ),
        "train_seconds_per_round": stats(float(e["seconds"]) for e in uploads),
        "rss_round_5_mb": rss.get(5),
        f"rss_round_{rounds}_mb": rss.get(rounds),
        "rss_growth_5_to_last": None if growth is None else round(growth, 4),
    }


def _watch(device: subprocess.Popen[bytes], log_path: Path, *, timeout: float) -> dict[str, Any]:
    """Read the device's /proc every 0.1 s until it exits; RSS at each evaluated round."""
    peak = private = 0.0
    rss_at: dict[int, float] = {}
    seen = 0
    deadline = time.monotonic() + timeout
    while device.poll() is None and time.monotonic() < deadline:
        now = _proc(device.pid)
        peak = max(peak, now.get("VmHWM", 0.0))
        private = max(private, now.get("private", 0.0))
        events = read_jsonl(log_path)
        for event in events[seen:]:
            if event.get("event") == "round.evaluated" and "VmRSS" in now:
                rss_at[int(event["round"])] = round(now["VmRSS"], 1)
        seen = len(events)
        time.sleep(0.1)
    return {"peak": peak, "private": private, "rss_at_round": rss_at}


def run(quick: bool) -> dict[str, Any]:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    rows = []
    for job, config, extra in _jobs():
        for arch in os.environ.get("BENCH_DEVICE_ARCHS", ",".join(ARCHS)).split(","):
            overrides = [
                *extra,
                f"rounds={rounds}",
                "federation.num_clients=2",
                "federation.min_clients=2",
                f"model.name={arch}",
            ]
            work = WORK / "device" / f"{job.replace(' ', '-')}-{arch}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            log(f"{job}, {arch}: bare torch")
            facts = _save_shard(config, overrides, work / "shard.npz")
            bare = _bare(work / "shard.npz", arch, facts)
            log(f"{job}, {arch}: a client of a federation, {rounds} rounds")
            client = _federation(config, overrides, work, rounds)
            ratio = None
            if "peak_rss_mb" in bare and client["peak_rss_mb"]:
                ratio = round(client["peak_rss_mb"] / bare["peak_rss_mb"], 3)
            rows.append(
                {
                    "job": job,
                    "arch": arch,
                    "window": facts["shape"][1:],
                    "client": client,
                    "bare_torch": bare,
                    "peak_ratio_to_bare": ratio,
                }
            )
            log(f"  client {client['peak_rss_mb']} MB, bare {bare.get('peak_rss_mb')} MB")
    return {
        "rounds": rounds,
        "cpu_pinning": "cgroup cpuset" if unavailable() is None else "taskset",
        "rows": rows,
        "goals": {
            "peak_ratio_le_1_2": all((r["peak_ratio_to_bare"] or 9) <= 1.2 for r in rows),
            "start_le_4_s": all(
                (r["client"]["start_to_first_training_s"] or 99) <= 4 for r in rows
            ),
            "no_growth_within_5pct": None
            if quick
            else all((r["client"]["rss_growth_5_to_last"] or 1) <= 0.05 for r in rows),
        },
    }


if __name__ == "__main__":
    bench_main("device", __doc__.split("\n")[0], run)
