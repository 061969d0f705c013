"""`mqttfl compare`: several methods on the same federation and seeds, one run after another.

Every (setting, method, seed) is a full local federation (:class:`LocalFederation`:
broker, coordinator, one process per client) in its own run directory. The two settings
are FedAPA Table III's halves: ``data`` (statistical heterogeneity only, the config's
model for every client) and ``model`` (clients cycle through tiny, middle and large).
A method that needs a particular model (``REQUIRED_MODEL``) runs with it in both
settings, and the tables say so; ``METHOD@MODEL`` (e.g. ``fedavg@transformer``) pins any
method to a model in the same way, to compare methods on one architecture. Results: ``compare.md`` and ``compare.json`` (accuracy,
macro-F1, MAE and KB per client-round as mean ± std over seeds; each run's metrics are
its summary's means over the last five rounds) and ``convergence.png`` (mean client
accuracy per round, averaged over seeds).

Two reference rows frame the methods: ``local`` (every client alone, the lower bound;
part of ``--methods all``) and ``pooled`` (:mod:`mqttfl.evaluation.pooled`: one model with the same
architecture and ``[train]`` recipe, trained for as many epochs as a Local client on the
union of all clients' training splits, scored on each client's test split; trained in
this process, per setting and seed, and kept in ``<setting>/pooled/seed-<n>/``). Where
the clients' data cannot be pooled (samples of different shapes, or different
architectures as in the ``model`` setting) the row is absent and the table says why.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.config import load_config
from mqttfl.data.shapes import sample_shape_problem
from mqttfl.data.sources import labels_are_ordinal
from mqttfl.engine.documents import CompareDocument, CompareRun, PooledEntry, compare_bytes
from mqttfl.errors import UsageError
from mqttfl.evaluation.compare_entries import (
    SETTINGS,
    RunResult,
    method_name,
    pinned_model,
    pooled_overrides,
    run_one,
    run_overrides,
)
from mqttfl.evaluation.compare_report import (
    aggregate,
    aggregate_pooled,
    markdown_table,
    plot_convergence,
)
from mqttfl.evaluation.pooled import PooledRun, run_pooled
from mqttfl.logs import configure_logging, get_logger


@dataclass(frozen=True)
class ComparePlan:
    """What ``mqttfl compare`` runs: every (setting, method, seed) of one config."""

    config: str
    overrides: list[str]
    methods: list[str]
    seeds: list[int]
    settings: list[str]
    out: Path
    resume: bool = False
    pooled: bool = True


def check_plan(plan: ComparePlan) -> list[tuple[str, str, int]]:
    """Every run of ``plan`` in order; raises naming a method, setting or config key that
    cannot run, before anything starts."""
    for method in plan.methods:
        get_algorithm(method_name(method))  # ConfigError naming the known methods
    unknown = sorted(set(plan.settings) - set(SETTINGS))
    if unknown:
        raise UsageError(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    runs = [(s, m, seed) for s in plan.settings for m in plan.methods for seed in plan.seeds]
    for setting, method, seed in runs:  # every config must load before anything starts
        make_context(load_config(plan.config, run_overrides(plan.overrides, setting, method, seed)))
    return runs


def compare(plan: ComparePlan) -> int:
    """Run ``plan``, write compare.md, compare.json and convergence.png into ``plan.out``;
    1 if a run failed."""
    runs = check_plan(plan)
    methods, settings, seeds = plan.methods, plan.settings, plan.seeds
    data = load_config(plan.config, plan.overrides).data
    split, ordinal = data.split, labels_are_ordinal(data) is True
    out = plan.out
    out.mkdir(parents=True, exist_ok=True)
    configure_logging(out / "compare.jsonl", level="info", console_level="warning")
    log = get_logger(client_id="compare")
    results = []
    cannot: dict[tuple[str, str], str | None] = {}
    for index, (setting, method, seed) in enumerate(runs, start=1):
        began = time.monotonic()
        overrides = run_overrides(plan.overrides, setting, method, seed)
        result = RunResult(setting, method, seed, out / setting / method / f"seed-{seed}")
        if (setting, method) not in cannot:  # a model that cannot take the data's samples
            cannot[(setting, method)] = sample_shape_problem(load_config(plan.config, overrides))
        result.absent = cannot[(setting, method)]
        if result.absent is None:
            result = run_one(plan.config, overrides, result, resume=plan.resume)
        results.append(result)
        seconds = round(time.monotonic() - began, 1)
        log.info(
            "compare.run_finished",
            setting=setting,
            method=method,
            seed=seed,
            seconds=seconds,
            error=result.error,
            resumed=result.resumed,
            **result.metrics,
        )
        status = (
            f"failed: {result.error}"
            if result.error
            else f"absent: {result.absent}"
            if result.absent
            else (
                f"acc {result.metrics['accuracy']:.4f}  f1 {result.metrics['f1']:.4f}  "
                + (f"mae {result.metrics['mae']:.3f}  " if ordinal else "")
                + f"{result.metrics['kb']:.1f} KB"
            )
        )
        took = "reused a finished run" if result.resumed else f"{seconds} s"
        sys.stdout.write(
            f"[{index}/{len(runs)}] {setting:<5} {method:<32} seed {seed}: {status} ({took})\n"
        )
        sys.stdout.flush()
    pooled_runs = [] if not plan.pooled else _run_pooled_references(plan)
    rows = aggregate(results, methods, settings)
    pooled = None if not plan.pooled else aggregate_pooled(pooled_runs, settings)
    (out / "compare.md").write_text(
        markdown_table(rows, methods, settings, seeds, pooled, split=split, ordinal=ordinal)
    )
    (out / "compare.json").write_bytes(
        compare_bytes(
            CompareDocument(
                config=plan.config,
                overrides=plan.overrides,
                seeds=seeds,
                split=split,
                ordinal_labels=ordinal,
                settings={
                    s: {"title": SETTINGS[s][0], "overrides": SETTINGS[s][1]} for s in settings
                },
                required_model={m: model for m in methods if (model := pinned_model(m))},
                rows=rows,
                pooled=pooled,
                pooled_runs=[
                    PooledEntry(
                        setting=p.setting,
                        seed=p.seed,
                        out=str(p.out),
                        metrics=p.metrics,
                        per_client=p.per_client,
                        absent=p.absent,
                    )
                    for p in pooled_runs
                ],
                runs=[
                    CompareRun(
                        setting=r.setting,
                        method=r.method,
                        seed=r.seed,
                        out=str(r.out),
                        metrics=r.metrics,
                        curve={str(t): a for t, a in r.curve.items()},
                        error=r.error,
                        absent=r.absent,
                    )
                    for r in results
                ],
            )
        )
    )
    plot_convergence(results, methods, settings, out / "convergence.png", pooled, split=split)
    sys.stdout.write((out / "compare.md").read_text() + f"results: {out}\n")
    return 1 if any(r.error for r in results) else 0


def _run_pooled_references(plan: ComparePlan) -> list[PooledRun]:
    log = get_logger(client_id="compare")
    ordinal = labels_are_ordinal(load_config(plan.config, plan.overrides).data) is True
    runs = []
    for setting in plan.settings:
        for seed in plan.seeds:
            began = time.monotonic()
            run = run_pooled(
                plan.config,
                pooled_overrides(plan.overrides, setting, seed),
                PooledRun(setting, seed, plan.out / setting / "pooled" / f"seed-{seed}"),
                resume=plan.resume,
            )
            runs.append(run)
            seconds = round(time.monotonic() - began, 1)
            log.info(
                "compare.pooled_finished",
                setting=setting,
                seed=seed,
                seconds=seconds,
                absent=run.absent,
                resumed=run.resumed,
                **run.metrics,
            )
            status = (
                f"absent: {run.absent}"
                if run.absent
                else f"acc {run.metrics['accuracy']:.4f}  f1 {run.metrics['f1']:.4f}"
                + (f"  mae {run.metrics['mae']:.3f}" if ordinal else "")
            )
            took = "reused" if run.resumed else f"{seconds} s"
            sys.stdout.write(f"[pooled] {setting:<5} seed {seed}: {status} ({took})\n")
            sys.stdout.flush()
    return runs
