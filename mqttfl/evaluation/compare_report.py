"""`mqttfl compare`'s report: rows averaged over seeds, the Table III markdown, the
convergence plot and compare.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mqttfl.engine.documents import CompareRow, MeanStd
from mqttfl.evaluation.compare_entries import (
    METRICS,
    POOLED_METRICS,
    REQUIRED_MODEL,
    SETTINGS,
    RunResult,
    pinned_model,
)
from mqttfl.evaluation.pooled import PooledRun
from mqttfl.evaluation.table import SPLIT_TEXT


def _mean_std(values: list[float]) -> MeanStd:
    array = np.asarray(values, dtype=np.float64)
    return MeanStd(
        mean=float(array.mean()), std=float(array.std(ddof=1)) if len(array) > 1 else 0.0
    )


def aggregate(
    results: list[RunResult], methods: list[str], settings: list[str]
) -> list[CompareRow]:
    rows = []
    for method in methods:
        for setting in settings:
            done = [
                r
                for r in results
                if r.method == method
                and r.setting == setting
                and r.error is None
                and r.absent is None
            ]
            row: dict[str, object] = {
                "method": method,
                "setting": setting,
                "runs": len(done),
                "model": pinned_model(method),
                "seeds": [r.seed for r in done],
                "failed_seeds": [
                    r.seed
                    for r in results
                    if r.method == method and r.setting == setting and r.error is not None
                ],
                "absent": next(
                    (
                        r.absent
                        for r in results
                        if r.method == method and r.setting == setting and r.absent
                    ),
                    None,
                ),
            }
            if done:
                row.update({k: _mean_std([r.metrics[k] for r in done]) for k in METRICS})
            rows.append(CompareRow.model_validate(row))
    return rows


def aggregate_pooled(pooled: list[PooledRun], settings: list[str]) -> list[CompareRow]:
    """One pooled row per setting: mean ± std over seeds, or why it is absent."""
    rows = []
    for setting in settings:
        runs = [p for p in pooled if p.setting == setting]
        done = [p for p in runs if p.absent is None]
        row: dict[str, object] = {
            "method": "pooled",
            "setting": setting,
            "runs": len(done),
            "seeds": [p.seed for p in done],
            "absent": next((p.absent for p in runs if p.absent is not None), None),
        }
        if done:
            row.update({k: _mean_std([p.metrics[k] for p in done]) for k in POOLED_METRICS})
        rows.append(CompareRow.model_validate(row))
    return rows


def _cell(row: CompareRow, key: str) -> str:
    found = row.metric(key)
    if found is None:
        return "failed"
    scale, digits = (100.0, 2) if key in ("accuracy", "f1") else (1.0, 3 if key == "mae" else 1)
    mean, std = found.mean * scale, found.std * scale
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(
    rows: list[CompareRow],
    methods: list[str],
    settings: list[str],
    seeds: list[int],
    pooled: list[CompareRow] | None = None,
    *,
    split: str = "window",
    ordinal: bool = True,
) -> str:
    """Table III's layout: one row per method, Acc./F1/MAE (and KB) per setting, then the
    pooled reference row (from :func:`aggregate_pooled`) when given. The MAE column only
    where labels are counts (``ordinal``); the intro names the ``split``."""
    by_key = {(r.method, r.setting): r for r in rows}
    metrics = [k for k in METRICS if ordinal or k != "mae"]
    columns = ("Acc. (%)", "F1 (%)", "MAE", "KB") if ordinal else ("Acc. (%)", "F1 (%)", "KB")
    head = ["Method"] + [f"{SETTINGS[s][0]}: {c}" for s in settings for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for method in methods:
        model = pinned_model(method)
        cells = [method + (" *" if model else "")]
        for setting in settings:
            row = by_key[(method, setting)]
            if row.absent and not row.runs:
                cells += ["absent"] * len(metrics)
                notes.append(f"{method} is absent in {SETTINGS[setting][0]}: {row.absent}.")
            else:
                cells += [_cell(row, k) for k in metrics]
        lines.append("| " + " | ".join(cells) + " |")
        if method in REQUIRED_MODEL:
            notes.append(f"\\* {method} needs model `{model}` and runs with it in every setting.")
        elif model:
            notes.append(f"\\* {method} runs model `{model}` in every setting.")
    if pooled is not None:
        lines.append(_pooled_line(pooled, settings, ordinal))
        notes += _pooled_notes(pooled, settings)
    if "local" in methods:
        notes.append("local: every client trains alone (the lower bound).")
    elif pooled is not None:
        notes.append("No local row: add `local` to --methods for the lower bound.")
    intro = (
        f"{SPLIT_TEXT.get(split, f'{split} split').capitalize()}. "
        f"Mean ± std over seeds {', '.join(map(str, seeds))}; each run's metrics are the mean over "
        "clients of their last five rounds. KB: uploaded plus downloaded per client-round.\n"
    )
    return "\n".join([intro, *lines, "", *notes]) + "\n"


def _absent(row: CompareRow | None) -> bool:
    return row is None or not row.runs


def _pooled_line(pooled: list[CompareRow], settings: list[str], ordinal: bool = True) -> str:
    by_setting = {r.setting: r for r in pooled}
    metrics = [k for k in POOLED_METRICS if ordinal or k != "mae"]
    cells = ["pooled †"]
    for setting in settings:
        row = by_setting.get(setting)
        if row is None or _absent(row):
            cells += ["absent"] * len(metrics) + ["-"]
        else:
            cells += [_cell(row, k) for k in metrics] + ["-"]
    return "| " + " | ".join(cells) + " |"


def _pooled_notes(pooled: list[CompareRow], settings: list[str]) -> list[str]:
    by_setting = {r.setting: r for r in pooled}
    notes = [
        "† pooled: one model of the same architecture and `[train]` recipe, trained for as "
        "many epochs as a Local client (rounds × local_epochs) on the union of all clients' "
        "training splits and scored on each client's test split (the centralized "
        "reference: its final model, no communication)."
    ]
    for setting in settings:
        row = by_setting.get(setting)
        if _absent(row):
            why = (row.absent if row is not None else None) or "not run"
            notes.append(f"pooled is absent in {SETTINGS[setting][0]}: {why}.")
    return notes


def plot_convergence(
    results: list[RunResult],
    methods: list[str],
    settings: list[str],
    path: Path,
    pooled: list[CompareRow] | None = None,
    *,
    split: str = "window",
) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6 * len(settings), 4.2), layout="constrained")
    axes = figure.subplots(1, len(settings), squeeze=False)[0]
    for ax, setting in zip(axes, settings, strict=True):
        for method in methods:
            curves = [
                r.curve for r in results if r.method == method and r.setting == setting and r.curve
            ]
            if not curves:
                continue
            rounds = sorted(set().union(*curves))
            mean = [np.mean([c[t] for c in curves if t in c]) for t in rounds]
            ax.plot(rounds, mean, marker="o" if len(rounds) < 12 else None, label=method)
        reference = next((r for r in pooled or [] if r.setting == setting and r.runs), None)
        if reference is not None and reference.accuracy is not None:
            ax.axhline(reference.accuracy.mean, color="black", ls="--", lw=1, label="pooled")
        ax.set_title(f"{SETTINGS[setting][0]} ({split} split)")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("mean client accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    figure.savefig(path, dpi=120)
