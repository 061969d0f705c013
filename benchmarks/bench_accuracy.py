"""Accuracy: FedAPA Table III and Table IV equivalents, 3 seeds, mean ± std, last 5 rounds.

Every registered method (``algorithm_names()``) runs as a real local federation through
``mqttfl compare``'s machinery (:mod:`mqttfl.evaluation.compare`: one run directory per setting,
method and seed; each run's metrics are the mean over clients of their last five
rounds). Datasets and settings:

- ``csi``: the synthetic 6-room CSI crowd-counting federation (configs/fedapa-csi.toml),
  both halves of Table III: ``data`` (statistical heterogeneity, LargeConvNet4 for all)
  and ``model`` (clients cycle through Tiny/Middle/LargeConvNet4);
- ``espectre``: presence from the ESPectre recordings (configs/presence-espectre.toml),
  ``data`` setting; skipped with a note when the shared data is missing;
- ``digits``: sklearn's 8×8 digits, 10 clients, n-way k-shot (configs/digits-fedsap.toml),
  ``data`` setting;
- ``mnist``: MNIST-5k, 8 clients, Dirichlet(0.5) (configs/mnist-fedpam.toml), ``data``.

Beside the registered methods, ``fedavg@transformer`` is FedAvg on FedAli's transformer
with FedAli's local recipe (Adam, its ``local_lr``, no weight decay, 5 epochs, batch 64):
the same model and budget, so the two rows differ only in FedAli's layer and prototypes.

Table III's rows are every method but the two Table IV ablations, then the pooled
(centralized) reference of :mod:`mqttfl.evaluation.pooled` (absent where the clients' samples differ
in shape or architecture, with the reason under the table); Table IV is the ablations and
FedAPA. Sizes: the full size (3 seeds, 20 rounds, reduced CSI windows) takes about
2 h 15 min on this 2-core machine (MNIST 75 min, csi 33); a run finished with
the same config is reused, so ``--datasets`` can spread it over several sittings.
``--quick`` (1 seed, 3 rounds, tiny shards) is a smoke check of the whole path.

    python -m benchmarks.bench_accuracy [--quick] [--datasets csi,espectre,digits] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

from benchmarks.common import REPO, RESULTS, WORK, log, write_result

TABLE_IV = ("fedapa-global-avg", "fedapa-global-avg-client-protos", "fedapa")

# dataset -> (config, settings, full-size overrides, quick overrides)
DATASETS: dict[str, tuple[str, list[str], list[str], list[str]]] = {
    "csi": (
        "configs/fedapa-csi.toml",
        ["data", "model"],
        ["rounds=20", "data.window=32", "data.samples_per_client=160", "method.warmup_rounds=10"],
        ["rounds=3", "data.window=24", "data.samples_per_client=120", "method.warmup_rounds=2"],
    ),
    "espectre": (
        "configs/presence-espectre.toml",
        ["data"],
        ["rounds=20", "method.warmup_rounds=10"],
        ["rounds=3", "method.warmup_rounds=2"],
    ),
    "digits": (
        "configs/digits-fedsap.toml",
        ["data"],
        ["rounds=20", "method.warmup_rounds=10"],
        ["rounds=3", "method.warmup_rounds=2"],
    ),
    "mnist": (
        "configs/mnist-fedpam.toml",
        ["data"],
        ["rounds=20", "method.warmup_rounds=10"],
        ["rounds=3", "method.warmup_rounds=2"],
    ),
}
FEDAVG_ON_FEDALI = "fedavg@transformer"


def fedali_recipe(config: str, base: list[str]) -> list[str]:
    """``[train]`` overrides that train like FedAli's clients do in this config."""
    from mqttfl.algorithms import make_context
    from mqttfl.config import load_config

    p = make_context(load_config(config, [*base, "method=fedali"])).params
    return [
        "train.optimizer=adam",
        f"train.lr={p.local_lr}",
        "train.weight_decay=0",
        f"train.local_epochs={p.local_epochs}",
        f"train.batch_size={p.local_batch_size}",
    ]


COMMON = [
    "federation.round_timeout_s=300",
    "federation.join_timeout_s=300",
    "federation.final_metrics_timeout_s=30",
]


def espectre_missing() -> str | None:
    from mqttfl.config import load_config
    from mqttfl.data.sources import shared_data_root

    root = shared_data_root(load_config(DATASETS["espectre"][0]).data) / "espectre"
    return None if root.is_dir() else f"no ESPectre recordings at {root}"


def run_dataset(
    name: str,
    quick: bool,
    methods: list[str],
    seeds: list[int],
    split: str = "window",
    settings_only: list[str] | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    from mqttfl.config import load_config
    from mqttfl.evaluation import compare_entries as entries
    from mqttfl.evaluation import compare_report as report
    from mqttfl.evaluation.pooled import PooledRun, run_pooled

    config, settings, full, small = DATASETS[name]
    settings = [s for s in settings if not settings_only or s in settings_only]
    base = [*COMMON, *(small if quick else full), f"data.split={split}", *(extra or [])]
    tag = "" if split == "window" else f"-{split}"
    ordinal = load_config(config, base).data.source == "synthetic"
    results = []
    began = time.monotonic()
    plan = [(s, m, seed) for s in settings for m in methods for seed in seeds]
    recipe = fedali_recipe(config, base)
    for index, (setting, method, seed) in enumerate(plan, start=1):
        out = WORK / f"accuracy{tag}" / name / setting / method / f"seed-{seed}"
        overrides = entries.run_overrides(base, setting, method, seed)
        if method == FEDAVG_ON_FEDALI:
            overrides += recipe
        # A run that finished with this exact config is reused (an interrupted benchmark
        # picks up where it stopped); anything else there would be resumed from an old
        # checkpoint by the coordinator, so it goes.
        if out.exists() and entries.finished_summary(out, load_config(config, overrides)) is None:
            shutil.rmtree(out)
        t0 = time.monotonic()
        result = entries.run_one(
            config, overrides, entries.RunResult(setting, method, seed, out), resume=True
        )
        results.append(result)
        status = result.error or f"acc {result.metrics['accuracy']:.4f}"
        took = "reused" if result.resumed else f"{time.monotonic() - t0:.0f} s"
        log(
            f"accuracy {name} [{index}/{len(plan)}] {setting} {method} seed {seed}: {status} ({took})"
        )
    pooled_runs = []
    for setting in settings:
        for seed in seeds:
            pooled_run = run_pooled(
                config,
                entries.pooled_overrides(base, setting, seed),
                PooledRun(
                    setting,
                    seed,
                    WORK / f"accuracy{tag}" / name / setting / "pooled" / f"seed-{seed}",
                ),
                resume=True,
            )
            pooled_runs.append(pooled_run)
            status = pooled_run.absent or f"acc {pooled_run.metrics['accuracy']:.4f}"
            log(f"accuracy {name} pooled {setting} seed {seed}: {status}")
    rows = report.aggregate(results, methods, settings)
    pooled = report.aggregate_pooled(pooled_runs, settings)
    table_iii = [m for m in methods if m not in TABLE_IV[:2]]
    table_iv = [m for m in TABLE_IV if m in methods]
    tables = {
        "table_iii": report.markdown_table(
            rows, table_iii, settings, seeds, pooled, split=split, ordinal=ordinal
        ),
        "table_iv": report.markdown_table(
            rows, table_iv, settings, seeds, split=split, ordinal=ordinal
        ),
    }
    plot = RESULTS / f"accuracy{tag}-{name}{'-quick' if quick else ''}.png"
    report.plot_convergence(results, methods, settings, plot, pooled, split=split)
    return {
        "config": config,
        "split": split,
        "settings": settings,
        "overrides": base,
        "seeds": seeds,
        "seconds": time.monotonic() - began,
        "rows": rows,
        "pooled": pooled,
        "pooled_runs": [
            {
                "setting": p.setting,
                "seed": p.seed,
                "out": str(p.out),
                "reused": p.resumed,
                "metrics": p.metrics,
                "per_client": p.per_client,
                "absent": p.absent,
            }
            for p in pooled_runs
        ],
        "tables": tables,
        "plot": str(plot),
        "runs": [
            {
                "setting": r.setting,
                "method": r.method,
                "seed": r.seed,
                "out": str(r.out),
                "reused": r.resumed,
                "metrics": r.metrics,
                "curve": {str(t): a for t, a in r.curve.items()},
                "error": r.error,
            }
            for r in results
        ],
    }


def run(
    quick: bool,
    datasets: list[str] | None = None,
    seeds: list[int] | None = None,
    *,
    split: str = "window",
    methods: list[str] | None = None,
    settings: list[str] | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    from mqttfl.algorithms import algorithm_names

    methods = methods or [*algorithm_names(), FEDAVG_ON_FEDALI]
    tag = "" if split == "window" else f"-{split}"
    seeds = seeds or ([0] if quick else [0, 1, 2])
    began = time.monotonic()
    out: dict[str, Any] = {}
    for name in datasets or list(DATASETS):
        if name == "espectre" and (why := espectre_missing()):
            log(f"accuracy espectre skipped: {why}")
            out[name] = {"skipped": why}
            continue
        out[name] = run_dataset(name, quick, methods, seeds, split, settings, extra)
    lines = []
    for name, data in out.items():
        if "tables" in data:
            lines += [
                f"## {name} ({data['config']})",
                "",
                "### Table III",
                "",
                data["tables"]["table_iii"],
                "### Table IV",
                "",
                data["tables"]["table_iv"],
            ]
        else:
            lines += [f"## {name}", "", data.get("skipped", ""), ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"accuracy{tag}{'-quick' if quick else ''}.md").write_text("\n".join(lines))
    return {
        "split": split,
        "extra_overrides": extra or [],
        "what": "Table III (data- and model-heterogeneous) and Table IV (aggregation ablations) equivalents: "
        "mean ± std over seeds of each run's last-5-round mean over clients",
        "methods": methods,
        "seeds": seeds,
        "size": "quick" if quick else "full",
        "seconds": time.monotonic() - began,
        "datasets": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="accuracy benchmark (Tables III and IV)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--datasets", help=f"comma-separated subset of {', '.join(DATASETS)}")
    # Every method's seed 0 first, then 0-1, ...: finished runs are reused, so a sitting
    # cut short still leaves each method with the same seeds.
    parser.add_argument("--seeds", help="comma-separated seeds (default 0,1,2; --quick 0)")
    parser.add_argument(
        "--split",
        choices=("window", "session"),
        default="window",
        help="data.split of every run: the papers' window split, or whole test sessions "
        "(results in accuracy-session.*)",
    )
    parser.add_argument("--methods", help="comma-separated subset of the methods (default all)")
    parser.add_argument("--settings", help="comma-separated subset of the settings (data,model)")
    parser.add_argument(
        "--set", dest="extra", action="append", default=[], help="one more override, KEY=VALUE"
    )
    args = parser.parse_args()
    os.chdir(REPO)  # configs/ and `python -m` paths are relative to the checkout
    datasets = args.datasets.split(",") if args.datasets else None
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    result = run(
        args.quick,
        datasets,
        seeds,
        split=args.split,
        methods=args.methods.split(",") if args.methods else None,
        settings=args.settings.split(",") if args.settings else None,
        extra=args.extra,
    )
    tag = "" if args.split == "window" else f"-{args.split}"
    path = write_result(
        f"accuracy{tag}",
        result,
        quick=args.quick,
        command="python -m benchmarks.bench_accuracy" + "".join(f" {a}" for a in sys.argv[1:]),
    )
    log(f"wrote {path}")
    print((RESULTS / f"accuracy{tag}{'-quick' if args.quick else ''}.md").read_text())


if __name__ == "__main__":
    main()
