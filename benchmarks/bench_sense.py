"""Sensing on a device: `mqttfl sense` against a torch client doing the same job.

- latency per window on one core (onnxruntime, one thread, batch 1) for every shipped
  architecture, at the two input shapes the CSI sources give (ESPectre: 50 packets x 51
  subcarriers; the default synthetic job's widest room: 64 x 242), next to torch's (one
  thread) and to the capture's window period (window / packet rate);
- the sensing process's peak RSS and its start-up to the first reading, replaying an
  ESPectre recording (`--fast`) and a shard, against a torch process that rebuilds the
  client from its state file and predicts the same windows (what a device would run
  without export);
- start-up: process start to the first reading printed (`--once --fast`);
- ``adapt`` (:mod:`benchmarks.sense_adapt`): FedAPA-S adapting on the stream:
  latency per buffer size, the adapting sensor's peak RSS, and the stream's curve on
  ESPectre against the run's figure (the README's figure, docs/figures/).

Each federation is tiny (1 round): the model's quality does not change these figures.

    python -m benchmarks.bench_sense [--quick]     # BENCH_SENSE_PART=latency, processes or adapt
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, WORK, bench_main, log, stats, time_calls

SHAPES = {"espectre": (50, 51), "synthetic-vht80": (64, 242)}
SYNTHETIC_RATE_HZ = 20.0  # mqttfl.data.synthetic.SAMPLE_RATE_HZ
TORCH_CLIENT = """
import sys, json, time
import numpy as np, torch
from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.config import RunConfig
from mqttfl.data.shard import load_shard
from mqttfl.nodes.client_state import Progress, StateFile
from mqttfl.nodes.device import build_client_side
from mqttfl.training.loops import predict_logits
run, export, client = sys.argv[1:4]
config = RunConfig.model_validate(json.load(open(run + "/summary.json"))["config"])
shard = load_shard(export + "/shard")
torch.set_num_threads(1)
method = build_client_side(config, get_algorithm(config.method), make_context(config), client, shard)
StateFile(__import__("pathlib").Path(run) / "clients" / f"client-{client}.pt").load(method.model, method, Progress())
for x in shard.x_test:
    predict_logits(method.model, x[None])
print("done", flush=True)
"""


# The child is started from a fresh, small interpreter: Linux carries a process's peak RSS
# across fork and exec, so a child of this (torch-loaded) process would report ours.
MEASURE = """
import json, os, subprocess, sys, time
started = time.monotonic()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
first = child.stdout.readline()
first_s = time.monotonic() - started
rest = child.stdout.read()
err = child.stderr.read()
_, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "rss_kb": usage.ru_maxrss,
                  "first_s": first_s, "out": (first + rest).decode(), "err": err.decode()[-2000:]}))
"""


def _peak_rss_mb(argv: list[str]) -> tuple[float, float, str]:
    """(peak RSS MB, seconds to the first line of stdout, stdout) of a child process."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, cwd=REPO, check=True
    )
    result = json.loads(done.stdout)
    if result["code"] != 0:
        raise RuntimeError(f"{argv[:6]} failed: {result['err']}")
    return result["rss_kb"] / 1024, float(result["first_s"]), str(result["out"])


def _federation(name: str, config: str, overrides: list[str], client: str) -> tuple[Path, Path]:
    run, export = WORK / f"sense-{name}", WORK / f"sense-{name}-export"
    for old in (run, export):  # a run directory holds one run (its broker state too)
        shutil.rmtree(old, ignore_errors=True)
    argv = [
        sys.executable,
        "-m",
        "mqttfl",
        "run",
        config,
        "--out",
        str(run),
        "--no-local-reference",
    ]
    for item in ["rounds=1", *overrides]:
        argv += ["--set", item]
    subprocess.run(argv, check=True, cwd=REPO, capture_output=True, timeout=1800)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttfl",
            "export",
            str(run),
            "--client",
            client,
            "--out",
            str(export),
            "--with-shard",
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
        timeout=1800,
    )
    return run, export


def espectre_root() -> Path:
    from mqttfl.config import DataConfig
    from mqttfl.data.sources import shared_data_root

    return (shared_data_root(DataConfig()) / "espectre").resolve()


def espectre_rate() -> float:
    """Mean packets per second over the ESPectre recordings (113 Hz here)."""
    from mqttfl.sensing.replay import recorded_rate

    rates = [r for p in sorted(espectre_root().glob("*/*.npz")) if (r := recorded_rate(p))]
    return float(np.mean(rates)) if rates else 113.0


def _torch_call(module: Any, x: Any) -> None:
    import torch

    with torch.no_grad():
        module(x)


def latency(quick: bool) -> list[dict[str, Any]]:
    """Per architecture and input shape: onnxruntime and torch ms per window, one thread."""
    import onnxruntime as ort
    import torch

    from mqttfl.export.client import export_onnx
    from mqttfl.models import build_model
    from mqttfl.models.names import MODEL_NAMES
    from mqttfl.models.scoring import Logits

    torch.set_num_threads(1)
    repeats = 7 if quick else 25
    espectre_hz = espectre_rate()
    rows = []
    for shape_name, (window, subcarriers) in SHAPES.items():
        rate = espectre_hz if shape_name == "espectre" else SYNTHETIC_RATE_HZ
        period_ms = 1000 * window / rate
        for arch in MODEL_NAMES:
            torch.manual_seed(0)
            model = build_model(
                arch,
                num_classes=21,
                embed_dim=256,
                input_dim=window * subcarriers if arch == "mlp" else None,
            )
            if arch == "transformer":  # FedAli's ALP layers attached, as it exports them
                for layer in model.alp_layers():  # type: ignore[operator]
                    start = torch.randn(16, layer.dim)
                    layer.attach(start, start, beta=0.2, gamma=0.999, epsilon=0.05, iterations=3)
            module = Logits(model).eval()
            x = np.random.default_rng(0).normal(size=(1, window, subcarriers)).astype(np.float32)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "model.onnx"
                export_onnx(module, np.repeat(x, 2, axis=0), path)
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                session = ort.InferenceSession(
                    str(path), options, providers=["CPUExecutionProvider"]
                )
                size = path.stat().st_size
            onnx_s = time_calls(
                partial(session.run, None, {"x": x}), repeats=repeats, min_time_s=0.05
            )
            torch_s = time_calls(
                partial(_torch_call, module, torch.from_numpy(x)), repeats=repeats, min_time_s=0.05
            )
            onnx_ms = stats(t * 1000 for t in onnx_s)
            torch_ms = stats(t * 1000 for t in torch_s)
            row: dict[str, Any] = {
                "shape": shape_name,
                "window": window,
                "subcarriers": subcarriers,
                "arch": arch,
                "onnx_bytes": size,
                "onnx_ms_per_window": onnx_ms,
                "torch_ms_per_window": torch_ms,
                "window_period_ms": period_ms,
                "times_faster_than_window_rate": period_ms / onnx_ms["median"],
            }
            rows.append(row)
            log(
                f"sense {shape_name} {arch}: onnx {onnx_ms['median']:.2f} ms, torch "
                f"{torch_ms['median']:.2f} ms per window; "
                f"{row['times_faster_than_window_rate']:.0f}x the window rate"
            )
    return rows


def processes(quick: bool) -> list[dict[str, Any]]:
    """Peak RSS and start-up of `mqttfl sense` against a torch client, on two exports."""
    from mqttfl.data.espectre import ESPECTRE_CHIPS, espectre_recordings
    from mqttfl.provisioning.local_broker import LocalBroker

    root = espectre_root()
    setups = {
        "espectre-middle": (
            "configs/presence-espectre.toml",
            ["federation.num_clients=2", f"data.path={root.parent}"],
            "1",
        ),
        "synthetic-large": ("configs/fedapa-csi.toml", ["federation.num_clients=2"], "0"),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, LocalBroker(Path(tmp) / "broker") as broker:
        for name, (config, overrides, client) in setups.items():
            run, export = _federation(name, config, overrides, client)
            sense = [sys.executable, "-m", "mqttfl", "sense", str(export), "--broker", broker.url]
            inputs = {"shard": f"shard:{export / 'shard'}"}
            if name.startswith("espectre"):
                chip = ESPECTRE_CHIPS[int(client)]
                inputs["capture"] = str(espectre_recordings(root)[chip][0].path)
            for kind, source in inputs.items():
                rss, _, out = _peak_rss_mb([*sense, "--input", source, "--fast"])
                startups = [
                    _peak_rss_mb([*sense, "--input", source, "--fast", "--once"])[1]
                    for _ in range(2 if quick else 5)
                ]
                rows.append(
                    {
                        "export": name,
                        "process": f"mqttfl sense ({kind})",
                        "input": source,
                        "peak_rss_mb": rss,
                        "readings": len(out.splitlines()),
                        "startup_to_first_reading_s": stats(startups),
                    }
                )
                log(
                    f"sense {name} {kind}: {rss:.0f} MB peak, first reading {stats(startups)['median']:.2f} s"
                )
            rss, first, _ = _peak_rss_mb(
                [sys.executable, "-c", TORCH_CLIENT, str(run), str(export), client]
            )
            rows.append(
                {
                    "export": name,
                    "process": "torch client (state file, predict each test window)",
                    "peak_rss_mb": rss,
                    "startup_to_first_reading_s": {"median": first, "n": 1},
                }
            )
            log(f"torch client {name}: {rss:.0f} MB peak")
    return rows


def adapt_processes(quick: bool) -> list[dict[str, Any]]:
    """Peak RSS of `mqttfl sense` on adapting exports (one-round FedAPA-S federations):
    the chip's longest ESPectre recording replayed, and the synthetic job's widest room
    (242 subcarriers) from its shard, both with the default buffer."""
    from mqttfl.data.espectre import ESPECTRE_CHIPS, espectre_recordings
    from mqttfl.provisioning.local_broker import LocalBroker

    root = espectre_root()
    fedapa_s = ["method=fedapa-session", "data.split=session", "federation.num_clients=2"]
    setups: dict[str, tuple[str, list[str], str, list[str]]] = {
        "espectre-middle-adapting": (
            "configs/presence-espectre.toml", [*fedapa_s, f"data.path={root.parent}"], "1", [],
        ),
        "synthetic-large-adapting": ("configs/fedapa-csi.toml", fedapa_s, "0", []),
    }  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp, LocalBroker(Path(tmp) / "broker") as broker:
        for name, (config, overrides, client, extra) in setups.items():
            _, export = _federation(name, config, overrides, client)
            sense = [sys.executable, "-m", "mqttfl", "sense", str(export), "--broker", broker.url]
            source = f"shard:{export / 'shard'}"
            if name.startswith("espectre"):
                files = [r.path for r in espectre_recordings(root)[ESPECTRE_CHIPS[int(client)]]]
                source = str(max(files, key=lambda f: f.stat().st_size))  # the longest
            rss, _, out = _peak_rss_mb([*sense, "--input", source, "--fast", "--json", *extra])
            states = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            rows.append(
                {
                    "export": name,
                    "process": "mqttfl sense, adapting",
                    "input": source,
                    "options": extra,
                    "peak_rss_mb": rss,
                    "readings": len(states),
                    "adapted_readings": sum(bool(s.get("adapted")) for s in states),
                }
            )
            log(f"sense {name}: {rss:.0f} MB peak, {len(states)} readings")
    return rows


def run(quick: bool) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    part = os.environ.get("BENCH_SENSE_PART", "all")  # latency, processes or all
    out: dict[str, Any] = {
        "what": "mqttfl sense (onnxruntime, no torch) against torch on the same model and windows",
        "goals": {"peak_rss_mb": 120, "times_faster_than_window_rate": 10},
    }
    if part in ("all", "latency"):
        out["latency"] = latency(quick)
    if part in ("all", "processes"):
        out["processes"] = processes(quick)
    if part in ("all", "adapt"):
        from benchmarks import sense_adapt

        period = {
            "espectre": 1000 * SHAPES["espectre"][0] / espectre_rate(),
            "synthetic-vht80": 1000 * SHAPES["synthetic-vht80"][0] / SYNTHETIC_RATE_HZ,
        }
        out["adapt_latency"] = sense_adapt.latency(quick, period)
        out["adapt_processes"] = adapt_processes(quick)
        out["adapt_espectre"] = sense_adapt.espectre_stream(quick, espectre_root())
        sense_adapt.figure(
            out["adapt_espectre"], REPO / "docs" / "figures" / "sense-stream-espectre.png"
        )
    return out


def main() -> None:
    part = os.environ.get("BENCH_SENSE_PART", "all")
    bench_main("sense" if part == "all" else f"sense-{part}", "sensing benchmark", run)


if __name__ == "__main__":
    main()
