"""The adapting sensor: `python -m benchmarks.bench_sense` part ``adapt``.

- **latency** with adaptation on, one onnxruntime thread, per buffer size: a reading
  (batch 1, the estimate in force), one estimate on a full buffer (the gate's pass, the
  layered statistics' passes, the embeddings' pass, the k-means), and the mean per window
  with one estimate every ``every`` windows, against the window period. Untrained models
  of the shipped FedAPA-S shapes (ESPectre: middle, d=64, 2 classes, 50x51; the default
  synthetic job: large, d=256, 21 classes, 64x242), with a gate whose threshold is 0, so
  every estimate computes the gate's fit ratio and adapts (the costliest path);
- **processes**: peak RSS of `mqttfl sense` on an adapting export (a one-round FedAPA-S
  federation), replaying an ESPectre recording with the default buffer, and on the
  synthetic job's widest room with a buffer of 512;
- **the stream on ESPectre**: `configs/presence-espectre.toml` with
  `--set data.split=session --set method=fedapa-session` (20 rounds), every client
  exported; `sense --eval` (transductive) against the run's figure, and `sense --eval
  --stream --curve` per client and per buffer size (the default's measurement).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, WORK, log, stats, time_calls

BUFFERS = (64, 128, 256, 512)
SHAPES = {"espectre": ((50, 51), "middle", 64, 2), "synthetic-vht80": ((64, 242), "large", 256, 21)}
ESPECTRE_OVERRIDES = ["data.split=session", "method=fedapa-session"]


def _adapter(arch: str, shape: tuple[int, int], embed_dim: int, classes: int, tmp: Path) -> Any:
    import onnxruntime as ort
    import torch

    from mqttfl.adaptation.shift import ShiftGate
    from mqttfl.export.adaptive import AdaptiveGraph, export_adaptive, norm_layers
    from mqttfl.models import build_model
    from mqttfl.sensing.adapt import Adapter
    from mqttfl.sensing.adaptive_spec import AdaptationSpec

    torch.manual_seed(0)
    model = build_model(arch, num_classes=classes, embed_dim=embed_dim).eval()
    layers = norm_layers(model)
    trained = [(np.zeros(m.num_features), np.ones(m.num_features)) for _, m in layers]
    path = tmp / f"{arch}.onnx"
    example = np.zeros((2, *shape), np.float32)
    export_adaptive(AdaptiveGraph(model), example, trained, path, 18)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    spec = AdaptationSpec(
        layers=tuple(name for name, _ in layers),
        channels=tuple(m.num_features for _, m in layers),
        trained_mean=tuple(m for m, _ in trained),
        trained_var=tuple(v for _, v in trained),
        inference="prototypes",
        prototypes=rng.normal(size=(classes, embed_dim)),
        available=np.ones(classes, bool),
        refine_steps=5,
        min_adapt_windows=8,
        tau=0.5,
        gate=ShiftGate(
            np.zeros(layers[0][1].num_features), np.ones(layers[0][1].num_features), 0.0, "bench"
        ),
    )
    return Adapter(session, "x", spec)


def latency(quick: bool, window_period_ms: dict[str, float]) -> list[dict[str, Any]]:
    from mqttfl.sensing.adapt import DEFAULT_EVERY

    repeats = 3 if quick else 7
    rows = []
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (shape, arch, embed_dim, classes) in SHAPES.items():
            adapter = _adapter(arch, shape, embed_dim, classes, Path(tmp))
            period = window_period_ms[name]
            for buffer in BUFFERS:
                x = rng.normal(size=(buffer, *shape)).astype(np.float32)
                adaptation, _ = adapter.adapt(x)
                estimate = stats(
                    t * 1000
                    for t in time_calls(partial(adapter.adapt, x), repeats=repeats, warmup=0)
                )
                reading = stats(
                    t * 1000
                    for t in time_calls(
                        partial(adapter.scores, adaptation, x[:1], "scores"),
                        repeats=repeats * 3,
                        min_time_s=0.05,
                    )
                )
                mean = reading["median"] + estimate["median"] / DEFAULT_EVERY
                rows.append(
                    {
                        "shape": name,
                        "arch": arch,
                        "buffer": buffer,
                        "every": DEFAULT_EVERY,
                        "reading_ms": reading,
                        "estimate_ms": estimate,
                        "mean_ms_per_window": mean,
                        "window_period_ms": period,
                        "times_faster_than_window_rate": period / mean,
                        "estimate_within_window_period": estimate["median"] < period,
                        "buffer_mb": x.nbytes / 2**20,
                    }
                )
                log(
                    f"adapt {name} {arch} buffer {buffer}: reading {reading['median']:.2f} ms, "
                    f"estimate {estimate['median']:.0f} ms, mean {mean:.2f} ms/window "
                    f"({period / mean:.0f}x the window rate)"
                )
    return rows


def _sense(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqttfl", "sense", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        timeout=1800,
    )


def espectre_stream(quick: bool, root: Path) -> dict[str, Any]:
    """The 20-round FedAPA-S run on ESPectre (session split), each client exported; the
    transductive parity and the stream's curve per client and buffer size."""
    run = WORK / "sense-adapt-espectre"
    shutil.rmtree(run, ignore_errors=True)  # a run directory holds one run
    argv = [sys.executable, "-m", "mqttfl", "run", "configs/presence-espectre.toml"]
    argv += ["--out", str(run), "--no-local-reference", "--plain"]
    for item in [*ESPECTRE_OVERRIDES, f"data.path={root.parent}"]:
        argv += ["--set", item]
    subprocess.run(argv, check=True, cwd=REPO, capture_output=True, timeout=3600)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    clients: list[dict[str, Any]] = []
    for client in sorted({str(r["client_id"]) for r in metrics}, key=int):
        last = max((r for r in metrics if str(r["client_id"]) == client), key=lambda r: r["round"])
        export = WORK / f"sense-adapt-espectre-{client}"
        subprocess.run(
            [sys.executable, "-m", "mqttfl", "export", str(run), "--client", client,
             "--out", str(export), "--with-shard"],
            check=True, cwd=REPO, capture_output=True, timeout=1800,
        )  # fmt: skip
        shard = f"shard:{export / 'shard'}"
        whole = json.loads(_sense(str(export), "--input", shard, "--eval", "--json").stdout)
        curves: dict[str, Any] = {}
        for buffer in (16, 32, 64) if quick else (8, 16, 32, 64, 128, 256):
            path = export / f"curve-{buffer}.json"
            result = _sense(
                str(export), "--input", shard, "--eval", "--json", "--stream",
                "--buffer", str(buffer), "--curve", str(path),
            )  # fmt: skip
            curves[str(buffer)] = {
                "accuracy": json.loads(result.stdout)["accuracy"],
                **json.loads(path.read_text()),
            }
        clients.append(
            {
                "client": client,
                "run": {k: last.get(k) for k in ("round", "accuracy", "f1", "mae", "adapted")}
                | {"shift_score": last.get("shift_score")},
                "sense_transductive": {
                    k: whole[k] for k in ("accuracy", "f1", "mae", "adapted", "shift_score")
                },
                "head_accuracy": last.get("head_accuracy"),
                "stream": curves,
            }
        )
        log(
            f"espectre client {client}: run {last['accuracy']:.4f}, sense {whole['accuracy']:.4f}, "
            + ", ".join(f"stream[{b}] {c['accuracy']:.4f}" for b, c in curves.items())
        )
    return {"run": str(run), "overrides": ESPECTRE_OVERRIDES, "clients": clients}


def figure(result: dict[str, Any], path: Path, buffer: str = "256") -> None:
    """Per client, against windows seen: the accuracy of the causal readings so far
    (left), and of the estimate in force applied to the whole session (right); dotted,
    the run's (transductive) figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    keys = ("stream_accuracy", "estimate_accuracy_on_session")
    titles = ("readings so far (causal)", "estimate in force, on the whole session")
    for ax, key, title in zip(axes, keys, titles, strict=True):
        for entry in result["clients"]:
            curve = entry["stream"].get(buffer, {}).get("curve", [])
            if not curve:
                continue
            n = [p["windows_seen"] for p in curve]
            line = ax.plot(n, [p[key] for p in curve], marker="o", ms=3,
                           label=f"client {entry['client']}")  # fmt: skip
            ax.axhline(entry["run"]["accuracy"], ls=":", color=line[0].get_color())
        ax.set_xlabel("windows seen (0.44 s each)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("accuracy")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"ESPectre, FedAPA-S on a day never trained on: mqttfl sense --eval --stream, "
        f"buffer {buffer} (dotted: the run)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
