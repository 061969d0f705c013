"""Recipes chosen on validation: a small grid per shipped config, never on test.

For each config, every (lr, local epochs) of the grid runs a real local federation
(``mqttfl run``, one process per client) for Local, FedAvg and the config's own method
with ``data.validation_fraction=0.2``: each client trains on 80% of its training split
and is scored on the held-out 20% (the test split is not read). ``[train]`` takes the
recipe with the best mean validation accuracy of the methods that train with it: Local,
FedAvg and the config's method, unless that method has a step of its own
(``METHOD_LR``: FedPAM's ``pam_lr``), which then takes the learning rate of its own best
recipe. Then the three run once with that on the test split, which is reported and
never used to choose.

    python -m benchmarks.tune_recipes [--quick]    # -> benchmarks/results/recipes.json
    BENCH_RECIPES_ONLY=csi,espectre python -m benchmarks.tune_recipes   # a subset
    BENCH_RECIPES_PART=fedali python -m benchmarks.tune_recipes   # -> recipes-fedali.json

Two methods take a step of their own (``OWN_STEPS``), searched apart on the same
validation split with ``BENCH_RECIPES_PART=fedali`` or ``fedpam``: FedAli trains with its
paper's recipe (Adam, 5 local epochs, batch 64, FedAli Sec. 5.1), whose 1e-4 belongs to
600 rounds from a pre-trained encoder (``method.local_lr``); FedPAM's λ-weighted
contrastive term diverges at steps that plain cross-entropy takes (``method.pam_lr``).
Settings whose failure is rare and depends on the seed (``STABILITY``: FedPAM's gradient
clipping, ``BENCH_RECIPES_PART=fedpam-clip``) run every value on seeds 0-2.

The image configs are tuned as shipped. The synthetic rooms are tuned at the size the
accuracy benchmark runs them (20 rounds of 32-step windows, 160 samples per client,
T_warm = 10: ``bench_accuracy.DATASETS``), since that is where their recipe is measured;
the 60-round default job then trains longer with the same step.

A run whose directory under benchmarks/results/work/recipes/ already holds a summary is
read, not run again (delete that folder to start over).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from benchmarks.bench_accuracy import DATASETS
from benchmarks.common import REPO, WORK, bench_main, log

# label -> (config, size overrides under which the recipe is searched)
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "digits": ("configs/digits-fedsap.toml", []),
    "mnist": ("configs/mnist-fedpam.toml", []),
    "csi": ("configs/fedapa-csi.toml", DATASETS["csi"][2]),
    "espectre": ("configs/presence-espectre.toml", DATASETS["espectre"][2]),
}
GRID = {"train.lr": (0.01, 0.05, 0.1), "train.local_epochs": (1, 2)}
SEARCHED = ("local", "fedavg")
VALIDATION = "data.validation_fraction=0.2"
METHOD_LR = {"fedpam": "method.pam_lr"}  # methods whose clients can take their own step
# method -> (its step's key, the steps searched, overrides it needs)
OWN_STEPS: dict[str, tuple[str, tuple[float, ...], list[str]]] = {
    "fedali": ("method.local_lr", (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), ["model.name=transformer"]),
    "fedpam": ("method.pam_lr", (0.01, 0.05, 0.1), []),
}
# part -> (method, key, values; None: the config as shipped): settings whose failure is
# rare and seed-dependent (one diverged client in one round), so every value runs SEEDS.
STABILITY: dict[str, tuple[str, str, tuple[float | None, ...]]] = {
    "fedpam-clip": ("fedpam", "method.pam_max_grad_norm", (None, 10.0, 1.0)),
    "fedpam-lr": ("fedpam", "method.pam_lr", (None, 0.005, 0.0025)),
}
SEEDS = (0, 1, 2)


def _run(config: str, name: str, overrides: list[str]) -> dict[str, Any]:
    out = WORK / "recipes" / name
    timing: dict[str, float] = {}
    if not (out / "summary.json").exists():
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mqttfl", "run", config, "--out", str(out)]
        cmd += ["--no-local-reference", *(a for o in overrides for a in ("--set", o))]
        began = time.monotonic()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-1500:]}")
        timing["seconds"] = time.monotonic() - began
    summary = json.loads((out / "summary.json").read_text())
    return {
        "accuracy": summary["mean"]["accuracy"],
        "f1": summary["mean"]["f1"],
        "missing_uploads": summary["missing_uploads"],
        **timing,
    }


def tune(label: str, config: str, size: list[str], quick: bool) -> dict[str, Any]:
    grid = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    if quick:
        grid = grid[:2]
    rows = []
    methods = (*SEARCHED, _config_method(config))
    for recipe in grid:
        settings = [f"{k}={v}" for k, v in recipe.items()]
        scores = {}
        for method in methods:
            name = f"{label}-{method}-" + "-".join(str(v) for v in recipe.values())
            own_lr = [f"{METHOD_LR[method]}={recipe['train.lr']}"] if method in METHOD_LR else []
            scores[method] = _run(
                config, name, [*size, f"method={method}", VALIDATION, *settings, *own_lr]
            )
        shared = [m for m in methods if m not in METHOD_LR]  # those that train with [train]
        mean = sum(scores[m]["accuracy"] for m in shared) / len(shared)
        log(f"{label} {settings}: validation {mean:.4f} ({scores})")
        rows.append({"recipe": recipe, "validation": scores, "validation_mean": mean})
    best = max(rows, key=lambda r: r["validation_mean"])
    settings = [f"{k}={v}" for k, v in best["recipe"].items()]
    tag = "-".join(str(v) for v in best["recipe"].values())
    own = methods[-1]
    own_best = max(rows, key=lambda r: r["validation"][own]["accuracy"])["recipe"]
    extra = {own: [f"{METHOD_LR[own]}={own_best['train.lr']}"]} if own in METHOD_LR else {}
    test = {
        method: _run(
            config,
            f"{label}-test-{method}-{tag}" + ("-own-lr" if method in extra else ""),
            [*size, f"method={method}", *settings, *extra.get(method, [])],
        )
        for method in methods
    }
    log(f"{label}: chose {settings}; test {test}")
    return {
        "config": config,
        "size": size,
        "grid": rows,
        "chosen": best["recipe"],
        "own_method_best": own_best,
        "own_method_lr": extra.get(own),
        "test": test,
    }


def tune_own_step(
    method: str, label: str, config: str, size: list[str], quick: bool
) -> dict[str, Any]:
    """The step of ``method`` (``OWN_STEPS``) with the best mean validation accuracy."""
    key, steps, needs = OWN_STEPS[method]
    scores = {
        lr: _run(
            config,
            f"{label}-{method}-{lr}",
            [*size, f"method={method}", *needs, VALIDATION, f"{key}={lr}"],
        )
        for lr in (steps[:2] if quick else steps)
    }
    chosen = max(scores, key=lambda lr: scores[lr]["accuracy"])
    figures = {lr: round(s["accuracy"], 4) for lr, s in scores.items()}
    log(f"{label} {method}: validation {figures}; chose {key}={chosen}")
    return {"config": config, "size": size, "key": key, "validation": scores, "chosen": chosen}


def tune_stability(
    part: str, label: str, config: str, size: list[str], quick: bool
) -> dict[str, Any]:
    """The value of a ``STABILITY`` setting with the best validation accuracy, mean over
    ``SEEDS`` (the config's own recipe otherwise, e.g. FedPAM's ``pam_lr``)."""
    method, key, values = STABILITY[part]
    seeds = SEEDS[:1] if quick else SEEDS
    scores: dict[str, dict[str, Any]] = {}
    for value in values[:2] if quick else values:
        setting = [] if value is None else [f"{key}={value}"]
        runs = [
            _run(
                config,
                f"{label}-{method}-"
                + ("as-shipped" if value is None else f"{key}-{value}")
                + f"-seed-{seed}",
                [*size, f"method={method}", VALIDATION, f"seed={seed}", *setting],
            )
            for seed in seeds
        ]
        accuracies = [r["accuracy"] for r in runs]
        scores[str(value)] = {
            "per_seed": runs,
            "mean": sum(accuracies) / len(accuracies),
            "worst": min(accuracies),
            "missing_uploads": sum(r["missing_uploads"] for r in runs),
        }
        log(f"{label} {method} {key}={value}: validation {scores[str(value)]}")
    chosen = max(scores, key=lambda v: scores[v]["mean"])
    log(f"{label} {method}: chose {key}={chosen}")
    return {
        "config": config,
        "size": size,
        "key": key,
        "seeds": list(seeds),
        "validation": scores,
        "chosen": chosen,
    }


def _config_method(config: str) -> str:
    import tomllib

    return str(tomllib.loads((REPO / config).read_text())["method"]["name"])


def run(quick: bool) -> dict[str, Any]:
    only = os.environ.get("BENCH_RECIPES_ONLY")
    labels = only.split(",") if only else list(CONFIGS)
    unknown = sorted(set(labels) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"BENCH_RECIPES_ONLY: unknown {unknown}; choose from {list(CONFIGS)}")
    part = os.environ.get("BENCH_RECIPES_PART")
    if part is None:
        return {label: tune(label, *CONFIGS[label], quick) for label in labels}
    if part in STABILITY:
        return {label: tune_stability(part, label, *CONFIGS[label], quick) for label in labels}
    if part not in OWN_STEPS:
        known = [*OWN_STEPS, *STABILITY]
        raise SystemExit(f"BENCH_RECIPES_PART: unknown {part!r}; choose from {known}")
    return {label: tune_own_step(part, label, *CONFIGS[label], quick) for label in labels}


if __name__ == "__main__":
    part = os.environ.get("BENCH_RECIPES_PART")
    bench_main(f"recipes-{part}" if part else "recipes", __doc__.splitlines()[0], run)
