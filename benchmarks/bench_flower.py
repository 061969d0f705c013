"""A peer, side by side: the same FedAvg job in mqttfl and in Flower, on this machine.

Same model (LargeConvNet4, 21 classes), data (the 6 synthetic CSI rooms of
configs/fedapa-csi.toml), client count (6, one OS process each), local epochs (1), rounds
and training code (see :mod:`benchmarks.flower_peer`). mqttfl runs as `mqttfl run` does
(local Mosquitto, coordinator, clients); Flower as its gRPC ``start_server`` and
``start_client`` on 127.0.0.1. Both have a counting TCP relay between the clients and
the server/broker, so "bytes" is every byte the clients sent and received (protocol
framing included) per client-round. Runs alternate (mqttfl, Flower, mqttfl, ...).
Reported: wall-time ratio (whole job, process start to exit), median round-time ratio
and bytes ratio, mqttfl over Flower. Goal: mqttfl no slower (wall ratio <= 1).

Flower lives in a separate venv (``benchmarks/requirements.txt``); its python is
``$MQTTFL_BENCH_PYTHON`` or ``.venv-bench/bin/python``. Without it this benchmark is
skipped with a message saying how to install it.

    python -m benchmarks.bench_flower [--quick]
"""

from __future__ import annotations

import functools
import json
import operator
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, WORK, bench_main, log, stats
from benchmarks.federation import CountingProxy, round_timeline, run_federation

CONFIG = "configs/fedapa-csi.toml"
CLIENTS = 6


def bench_python() -> Path:
    return Path(os.environ.get("MQTTFL_BENCH_PYTHON") or REPO / ".venv-bench" / "bin" / "python")


def flower_available() -> str | None:
    """None if Flower can be imported by the benchmark python, else why not."""
    python = bench_python()
    if not python.exists():
        return f"no benchmark venv at {python}"
    probe = subprocess.run(
        [str(python), "-c", "import flwr, torch, mqttfl; print(flwr.__version__)"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"},
    )
    if probe.returncode != 0:
        return f"{python} cannot import flwr/torch/mqttfl: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def _overrides(rounds: int) -> list[str]:
    return [
        "method=fedavg",
        f"rounds={rounds}",
        f"federation.num_clients={CLIENTS}",
        "model.name=large",
        "model.per_client=[]",
        "train.local_epochs=1",
    ]


def run_mqttfl(rounds: int, index: int) -> dict[str, Any]:
    result = run_federation(
        CONFIG,
        [*_overrides(rounds), f"run_id=bench-peer-{index}"],
        WORK / f"peer-mqttfl-{index}",
        count_client_bytes=True,
    )
    timeline = round_timeline(result.out)
    assert result.proxy is not None
    return {
        "wall_s": result.wall_s,
        "round_s": stats(r["cycle_s"] for r in timeline if r["round"] > 1),
        "client_bytes": result.proxy["up"] + result.proxy["down"],
        "client_bytes_per_client_round": (result.proxy["up"] + result.proxy["down"])
        / (CLIENTS * rounds),
        "payload_bytes_per_client_round": result.summary.comm.up_bytes_per_client_round
        + result.summary.comm.down_bytes_per_client_round,
        "mean_accuracy_last5": result.summary.mean.accuracy,
    }


def _free_port() -> int:
    from mqttfl.provisioning.local_broker import free_port

    return free_port()


def run_flower(rounds: int, index: int) -> dict[str, Any]:
    from mqttfl.provisioning.local_broker import port_open

    work = WORK / f"peer-flower-{index}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    python = str(bench_python())
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    port = _free_port()
    out = work / "server.json"
    children: list[subprocess.Popen[bytes]] = []

    def spawn(args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(work / log_name, "wb") as handle:
            child = subprocess.Popen(
                [python, "-m", "benchmarks.flower_peer", *args],
                cwd=REPO,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        children.append(child)
        return child

    with CountingProxy(port) as proxy:
        began = time.monotonic()
        try:
            server = spawn(
                [
                    "server",
                    "--port",
                    str(port),
                    "--clients",
                    str(CLIENTS),
                    "--rounds",
                    str(rounds),
                    "--out",
                    str(out),
                ],
                "server.log",
            )
            deadline = time.monotonic() + 120
            while not port_open(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Flower server did not start: {(work / 'server.log').read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            overrides: list[str] = functools.reduce(
                operator.iadd, (["--set", item] for item in _overrides(rounds)), []
            )
            for cid in range(CLIENTS):
                spawn(
                    [
                        "client",
                        "--port",
                        str(proxy.port),
                        "--id",
                        str(cid),
                        "--config",
                        CONFIG,
                        *overrides,
                    ],
                    f"client-{cid}.log",
                )
            server.wait(timeout=3600)
            for child in children:
                child.wait(timeout=60)
            wall = time.monotonic() - began
        finally:
            for child in children:
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
    if server.returncode != 0 or not out.exists():
        raise RuntimeError(f"Flower server failed: {(work / 'server.log').read_text()[-2000:]}")
    result = json.loads(out.read_text())
    starts = {m["round"]: m["fit_configured"] for m in result["marks"] if "fit_configured" in m}
    ends = {m["round"]: m["evaluated"] for m in result["marks"] if "evaluated" in m}
    cycles = [
        (starts.get(t + 1) or ends[t]) - starts[t] for t in sorted(starts) if t > 1 and t in ends
    ]
    accuracies = [m["mean_accuracy"] for m in result["marks"] if "mean_accuracy" in m]
    total = proxy.up + proxy.down
    return {
        "wall_s": wall,
        "round_s": stats(cycles),
        "client_bytes": total,
        "client_bytes_per_client_round": total / (CLIENTS * rounds),
        "flwr": result["flwr"],
        "mean_accuracy_last5": statistics.mean(accuracies[-5:]) if accuracies else None,
    }


def run(quick: bool) -> dict[str, Any]:
    why = flower_available()
    if why is not None:
        message = (
            f"skipped: Flower is not installed ({why}). Install it with: python3 -m venv .venv-bench && "
            ".venv-bench/bin/python -m pip install 'torch==2.13.0' && "
            ".venv-bench/bin/python -m pip install -e '.[images]' -r benchmarks/requirements.txt"
        )
        log(message)
        return {"skipped": message}
    rounds = 3 if quick else 10
    repeats = 1 if quick else 2
    mqttfl_runs, flower_runs = [], []
    for index in range(repeats):
        log(f"peer: mqttfl run {index + 1}/{repeats}")
        mqttfl_runs.append(run_mqttfl(rounds, index))
        log(f"peer: Flower run {index + 1}/{repeats}")
        flower_runs.append(run_flower(rounds, index))

    def median(runs: list[dict[str, Any]], key: str) -> float:
        values = [r[key]["median"] if isinstance(r[key], dict) else r[key] for r in runs]
        return float(statistics.median(values))

    wall_ratio = median(mqttfl_runs, "wall_s") / median(flower_runs, "wall_s")
    round_ratio = median(mqttfl_runs, "round_s") / median(flower_runs, "round_s")
    bytes_ratio = median(mqttfl_runs, "client_bytes_per_client_round") / median(
        flower_runs, "client_bytes_per_client_round"
    )
    log(
        f"peer: wall ratio {wall_ratio:.3f}, round ratio {round_ratio:.3f}, bytes ratio {bytes_ratio:.3f}"
    )
    return {
        "what": "FedAvg, LargeConvNet4, 6 synthetic CSI clients, 1 local epoch, same rounds and training code, "
        "in mqttfl and in Flower (gRPC start_server/start_client) on 127.0.0.1; ratios are mqttfl/Flower",
        "rounds": rounds,
        "clients": CLIENTS,
        "repeats": repeats,
        "goal": {
            "text": "mqttfl is no slower (wall-time ratio <= 1)",
            "figure": wall_ratio,
            "met": wall_ratio <= 1.0,
        },
        "wall_time_ratio": wall_ratio,
        "round_time_ratio": round_ratio,
        "bytes_ratio": bytes_ratio,
        "mqttfl": mqttfl_runs,
        "flower": flower_runs,
    }


def main() -> None:
    bench_main("flower", "mqttfl vs Flower", run)


if __name__ == "__main__":
    main()
