"""How far a class moves between a client's sessions, against how far the classes lie apart.

For every client and class c: drift_c = ‖μ_c(train) - μ_c(test)‖, μ the mean of a window
representation over the client's training windows or its test windows; separation = the
mean over class pairs of ‖μ_c(train) - μ_c'(train)‖. The **drift ratio** is the mean drift
over the mean separation, averaged over clients: near 0 the test windows sit where their
class was trained; at 1 a class moves as far as the next class is away. It is measured
under the window split (test windows from the trained sessions) and the session split.

- ``input``: two raw representations of a window (time × subcarrier amplitude): its
  ``profile`` (mean over time per subcarrier: where the receiver gain and the static
  multipath show) and its ``motion`` (standard deviation over time per subcarrier), on
  every source of :mod:`benchmarks.bench_sessions`;
- ``levels``: the receiver gain a session holds (:func:`session_levels`);
- ``embedding``: r(h) of models trained by Local, FedAvg, FedAPA and FedAPA-S on ESPectre
  (seed 0; FedAPA-S's windows embedded after its test-time statistics, each split's
  windows with their own), i.e. the class prototypes of Eq. 4 per session.

Figures (docs/figures/): ``session_drift_input.png``, ``session_drift_embedding.png`` and
``sessions_accuracy.png`` and ``sessions_tradeoff.png`` (accuracy against bytes), from the
tables of benchmarks/results/sessions.json.

    python -m benchmarks.bench_session_drift [--quick]

``BENCH_DRIFT_KEEP_EMBEDDING=1`` keeps the embedding figures of the existing JSON (they
train eight federations) and redraws the figures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from itertools import combinations
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.bench_sessions import DEFAULT_SOURCES, SOURCES, SPLITS, federate, load
from benchmarks.common import REPO, RESULTS, bench_main, log

if TYPE_CHECKING:
    from mqttfl.data.shard import Shard

FIGURES = REPO / "docs" / "figures"
FEATURES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "profile": lambda x: x.mean(axis=1),
    "motion": lambda x: x.std(axis=1),
}
EMBEDDING_METHODS = ("local", "fedavg", "fedapa", "fedapa-session")


def drift_ratio(
    train: np.ndarray, y_train: np.ndarray, test: np.ndarray, y_test: np.ndarray
) -> float | None:
    """Mean ‖μ_c(train) - μ_c(test)‖ over the classes in both, over the mean pairwise
    ‖μ_c(train) - μ_c'(train)‖ (module docstring); None with fewer than two classes."""
    classes = [c for c in np.unique(y_train) if (y_test == c).any()]
    means = {c: train[y_train == c].mean(axis=0) for c in np.unique(y_train)}
    if len(means) < 2 or not classes:
        return None
    drift = np.mean([np.linalg.norm(means[c] - test[y_test == c].mean(axis=0)) for c in classes])
    separation = np.mean([np.linalg.norm(means[a] - means[b]) for a, b in combinations(means, 2)])
    return float(drift / max(float(separation), 1e-12))


def mean_ratio(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else float("nan")


def input_drift(shards: list[dict[str, Shard]]) -> dict[str, float]:
    out = {}
    for name, feature in FEATURES.items():
        out[name] = mean_ratio(
            [
                drift_ratio(
                    feature(s.x_train).reshape(len(s.y_train), -1),
                    s.y_train,
                    feature(s.x_test).reshape(len(s.y_test), -1),
                    s.y_test,
                )
                for federation in shards
                for s in federation.values()
            ]
        )
    return out


def session_levels(shards: list[dict[str, Shard]]) -> dict[str, float] | None:
    """The receiver gain a session holds: per client and label, the coefficient of
    variation of the mean amplitude of its sessions (between sessions), against the CV of
    the windows' mean amplitude inside a session (medians over clients); None for shards
    without session ids (the Intel 5300 federations are z-scored per client)."""
    between: list[float] = []
    within: list[float] = []
    for federation in shards:
        for s in federation.values():
            if s.s_train is None or s.s_test is None:
                return None
            x = np.concatenate([s.x_train, s.x_test])
            ids = np.concatenate([s.s_train, s.s_test])
            y = np.concatenate([s.y_train, s.y_test])
            for c in np.unique(y):
                levels = [float(x[(ids == k) & (y == c)].mean()) for k in np.unique(ids[y == c])]
                if len(levels) > 1:
                    between.append(float(np.std(levels) / np.mean(levels)))
            for k in np.unique(ids):
                window = x[ids == k].mean(axis=tuple(range(1, x.ndim)))
                within.append(float(window.std() / window.mean()))
    return {
        "between_sessions_cv": float(np.median(between)),
        "within_session_cv": float(np.median(within)),
    }


def embedding_drift(source: str, split: str, seed: int, extra: list[str]) -> dict[str, Any]:
    from mqttfl.algorithms.fedapa.session import FedAPASessionClient, renormalize
    from mqttfl.training.loops import embed_all

    out: dict[str, Any] = {}
    for method in EMBEDDING_METHODS:
        config, federations = load(SOURCES[source], seed, split, extra)
        ratios = []
        for shards in federations:
            result = federate(config, shards, method)
            for cid, side in result.sides.items():
                s = shards[cid]
                if isinstance(side, FedAPASessionClient):
                    z_tr = embed_all(renormalize(side.model, s.x_train), s.x_train)
                    z_te = embed_all(renormalize(side.model, s.x_test), s.x_test)
                else:
                    z_tr, z_te = embed_all(side.model, s.x_train), embed_all(side.model, s.x_test)
                ratios.append(drift_ratio(z_tr, s.y_train, z_te, s.y_test))
        out[method] = mean_ratio(ratios)
        log(f"  embedding {source} {split} {method}: {out[method]:.2f}")
    return out


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    sources = list(results["input"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, feature in zip(axes, FEATURES, strict=True):
        for k, split in enumerate(SPLITS):
            values = [results["input"][s][split][feature] for s in sources]
            ax.bar(np.arange(len(sources)) + 0.4 * k, values, 0.4, label=f"{split} split")
        ax.set_xticks(np.arange(len(sources)) + 0.2, sources, fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"input: window {feature}")
    axes[0].set_ylabel("class drift / class separation")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(FIGURES / "session_drift_input.png", dpi=120)
    plt.close(fig)

    emb = results.get("embedding", {})
    if emb:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        for k, split in enumerate(SPLITS):
            values = [emb[split][m] for m in EMBEDDING_METHODS]
            ax.bar(np.arange(len(EMBEDDING_METHODS)) + 0.4 * k, values, 0.4, label=f"{split}")
        ax.set_xticks(np.arange(len(EMBEDDING_METHODS)) + 0.2, EMBEDDING_METHODS)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("prototype drift / separation")
        ax.set_title("ESPectre: class prototypes r(h) between sessions")
        ax.legend()
        fig.tight_layout()
        fig.savefig(FIGURES / "session_drift_embedding.png", dpi=120)
        plt.close(fig)

    tables = RESULTS / "sessions.json"
    if tables.exists():
        data = json.loads(tables.read_text())["sources"]
        names = [n for n in ("espectre", "intel5300", "intel5300-file", "rooms") if n in data]
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
        for ax, name in zip(axes[0], names, strict=True):
            splits = data[name]["splits"]
            methods = [m for m in splits.get("session", {}) if m in splits.get("window", {})]
            for k, split in enumerate(SPLITS):
                values = [splits[split][m]["mean"] for m in methods]
                ax.bar(np.arange(len(methods)) + 0.4 * k, values, 0.4, label=split)
            ax.set_xticks(np.arange(len(methods)) + 0.2, methods, rotation=60, fontsize=7)
            ax.set_title(name)
            ax.set_ylim(0, 100)
        axes[0][0].set_ylabel("mean client accuracy (%)")
        axes[0][0].legend()
        fig.tight_layout()
        fig.savefig(FIGURES / "sessions_accuracy.png", dpi=120)
        plt.close(fig)
        plot_tradeoff(data)


def plot_tradeoff(data: dict[str, Any]) -> None:
    """docs/figures/sessions_tradeoff.png: session-split accuracy against the bytes a client
    sends and receives per round, per real source (the curve asked for where its
    goal is not met): a method is worth its bytes only above and left of the others."""
    import matplotlib.pyplot as plt

    names = [n for n in ("espectre", "intel5300", "intel5300-file") if n in data]
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        table = data[name]["splits"].get("session", {})
        for method, row in table.items():
            adapted = "adabn" in method or method.startswith("fedapa-session")
            ax.scatter(row["bytes"] / 1e3, row["mean"], marker="o" if adapted else "s", s=18)
            ax.annotate(method, (row["bytes"] / 1e3, row["mean"]), fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("kB per client-round (up + down)")
        ax.set_title(f"{name}, session split")
    axes[0][0].set_ylabel("mean client accuracy (%)")
    fig.tight_layout()
    fig.savefig(FIGURES / "sessions_tradeoff.png", dpi=120)
    plt.close(fig)


def run(quick: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {"input": {}, "embedding": {}}
    for name in DEFAULT_SOURCES:
        source = SOURCES[name]
        extra = source.quick if quick else []
        results["input"][name] = {}
        for split in SPLITS:
            try:
                _, shards = load(source, 0, split, extra)
            except FileNotFoundError:
                break
            results["input"][name][split] = input_drift(shards)
            log(f"input {name} {split}: {results['input'][name][split]}")
            if split == "session":
                results.setdefault("levels", {})[name] = session_levels(shards)
        if not results["input"][name]:
            del results["input"][name]
    previous = RESULTS / "session-drift.json"
    if os.environ.get("BENCH_DRIFT_KEEP_EMBEDDING") and previous.exists():
        results["embedding"] = json.loads(previous.read_text())["embedding"]
    else:
        for split in SPLITS:
            results["embedding"][split] = embedding_drift(
                "espectre", split, 0, SOURCES["espectre"].quick if quick else []
            )
    if not quick:
        plot(results)
    return {
        "what": "drift ratio: mean distance of a class's mean between train and test windows "
        "over the mean distance between classes (per client; median over clients); seed 0",
        **results,
    }


def main() -> None:
    bench_main("session-drift", "class drift between sessions against class separation", run)


if __name__ == "__main__":
    main()
