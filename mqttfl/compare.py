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
part of ``--methods all``) and ``pooled`` (:mod:`mqttfl.pooled`: one model with the same
architecture and ``[train]`` recipe, trained for as many epochs as a Local client on the
union of all clients' training splits, scored on each client's test split; trained in
this process, per setting and seed, and kept in ``<setting>/pooled/seed-<n>/``). Where
the clients' data cannot be pooled (samples of different shapes, or different
architectures as in the ``model`` setting) the row is absent and the table says why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.algorithms import algorithm_names, get_algorithm, make_context, own_params
from mqttfl.config import load_config
from mqttfl.errors import MqttflError
from mqttfl.logs import configure_logging, get_logger
from mqttfl.pooled import PooledRun, run_pooled

SETTINGS: dict[str, tuple[str, list[str]]] = {
    "data": ("Statistical Data", []),
    "model": ("Model Architecture", ['model.per_client=["tiny", "middle", "large"]']),
}
#: methods that only run on one architecture; they use it in every setting
REQUIRED_MODEL: dict[str, str] = {
    name: model for name in algorithm_names() if (model := get_algorithm(name).required_model)
}
METRICS = ("accuracy", "f1", "mae", "kb")


def method_name(method: str) -> str:
    """The registered method of a compare entry (``fedavg@transformer`` -> ``fedavg``)."""
    return method.split("@", 1)[0]


def pinned_model(method: str) -> str | None:
    """The model a compare entry runs with in every setting, or None (the config's)."""
    name, _, model = method.partition("@")
    return model or REQUIRED_MODEL.get(name)


POOLED_METRICS = ("accuracy", "f1", "mae")


@dataclass
class RunResult:
    setting: str
    method: str
    seed: int
    out: Path
    metrics: dict[str, float] = field(default_factory=dict)
    curve: dict[int, float] = field(default_factory=dict)  # round -> mean client accuracy
    error: str | None = None
    resumed: bool = False


def run_overrides(base: list[str], setting: str, method: str, seed: int) -> list[str]:
    """The --set list of one run: the user's, then the setting's, method and seed."""
    overrides = [*base, *SETTINGS[setting][1], f"method={method_name(method)}", f"seed={seed}"]
    if model := pinned_model(method):
        overrides += [f"model.name={model}", "model.per_client=[]"]
    return overrides


def read_curve(metrics_path: Path) -> dict[int, float]:
    """Mean accuracy over the clients that reported each round (metrics.jsonl)."""
    by_round: dict[int, list[float]] = {}
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                by_round.setdefault(int(record["round"]), []).append(float(record["accuracy"]))
    return {t: float(np.mean(values)) for t, values in sorted(by_round.items())}


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    comm = summary["comm"]
    kb = (comm["up_bytes_per_client_round"] + comm["down_bytes_per_client_round"]) / 1000
    return {**{k: float(summary["mean"][k]) for k in ("accuracy", "f1", "mae")}, "kb": float(kb)}


def finished_summary(out: Path, config: Any) -> dict[str, Any] | None:
    """A finished run's summary in ``out``, if it ran with exactly this config (for --resume)."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    recorded = summary.get("config")
    if not isinstance(recorded, dict) or _run_identity(recorded) != _run_identity(
        config.recorded()
    ):
        return None
    return summary


def _run_identity(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded config without the ``[method]`` keys of other methods: one config file
    serves every method of a compare, and a step added for FedPAM changes no FedAPA run."""
    method_params = recorded.get("method_params")
    if not isinstance(method_params, dict):
        return recorded
    try:
        own = own_params(str(recorded.get("method")), method_params)
    except MqttflError:  # an unknown method: compare as recorded
        return recorded
    return {**recorded, "method_params": own}


def run_one(
    config_path: str, overrides: list[str], result: RunResult, resume: bool = False
) -> RunResult:
    from mqttfl.runtime.launcher import LocalFederation

    config = load_config(config_path, overrides)
    summary = finished_summary(result.out, config) if resume else None
    if summary is not None:
        result.resumed = True
        result.metrics = summary_metrics(summary)
        result.curve = read_curve(result.out / "metrics.jsonl")
        return result
    try:
        summary = LocalFederation(
            config, config_path, overrides, result.out, coordinator_console="warning"
        ).run()
    except MqttflError as exc:
        result.error = str(exc)
        return result
    result.metrics = summary_metrics(summary)
    result.curve = read_curve(result.out / "metrics.jsonl")
    return result


def pooled_overrides(base: list[str], setting: str, seed: int) -> list[str]:
    """The --set list of a setting's pooled reference (no method: it trains plain CE)."""
    return [*base, *SETTINGS[setting][1], f"seed={seed}"]


def _mean_std(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0}


def aggregate(
    results: list[RunResult], methods: list[str], settings: list[str]
) -> list[dict[str, Any]]:
    rows = []
    for method in methods:
        for setting in settings:
            done = [
                r
                for r in results
                if r.method == method and r.setting == setting and r.error is None
            ]
            row: dict[str, Any] = {
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
            }
            if done:
                row.update({k: _mean_std([r.metrics[k] for r in done]) for k in METRICS})
            rows.append(row)
    return rows


def aggregate_pooled(pooled: list[PooledRun], settings: list[str]) -> list[dict[str, Any]]:
    """One pooled row per setting: mean ± std over seeds, or why it is absent."""
    rows = []
    for setting in settings:
        runs = [p for p in pooled if p.setting == setting]
        done = [p for p in runs if p.absent is None]
        row: dict[str, Any] = {
            "method": "pooled",
            "setting": setting,
            "runs": len(done),
            "seeds": [p.seed for p in done],
            "absent": next((p.absent for p in runs if p.absent is not None), None),
        }
        if done:
            row.update({k: _mean_std([p.metrics[k] for p in done]) for k in POOLED_METRICS})
        rows.append(row)
    return rows


def _cell(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return "failed"
    scale, digits = (100.0, 2) if key in ("accuracy", "f1") else (1.0, 3 if key == "mae" else 1)
    mean, std = row[key]["mean"] * scale, row[key]["std"] * scale
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(
    rows: list[dict[str, Any]],
    methods: list[str],
    settings: list[str],
    seeds: list[int],
    pooled: list[dict[str, Any]] | None = None,
) -> str:
    """Table III's layout: one row per method, Acc./F1/MAE (and KB) per setting, then the
    pooled reference row (from :func:`aggregate_pooled`) when given."""
    by_key = {(r["method"], r["setting"]): r for r in rows}
    columns = ("Acc. (%)", "F1 (%)", "MAE", "KB")
    head = ["Method"] + [f"{SETTINGS[s][0]}: {c}" for s in settings for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for method in methods:
        model = pinned_model(method)
        cells = [method + (" *" if model else "")]
        for setting in settings:
            cells += [_cell(by_key[(method, setting)], k) for k in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
        if method in REQUIRED_MODEL:
            notes.append(f"\\* {method} needs model `{model}` and runs with it in every setting.")
        elif model:
            notes.append(f"\\* {method} runs model `{model}` in every setting.")
    if pooled is not None:
        lines.append(_pooled_line(pooled, settings))
        notes += _pooled_notes(pooled, settings)
    if "local" in methods:
        notes.append("local: every client trains alone (the lower bound).")
    elif pooled is not None:
        notes.append("No local row: add `local` to --methods for the lower bound.")
    intro = (
        f"Mean ± std over seeds {', '.join(map(str, seeds))}; each run's metrics are the mean over "
        "clients of their last five rounds. KB: uploaded plus downloaded per client-round.\n"
    )
    return "\n".join([intro, *lines, "", *notes]) + "\n"


def _absent(row: dict[str, Any]) -> bool:
    return not row.get("runs")


def _pooled_line(pooled: list[dict[str, Any]], settings: list[str]) -> str:
    by_setting = {r["setting"]: r for r in pooled}
    cells = ["pooled †"]
    for setting in settings:
        row = by_setting.get(setting, {})
        if _absent(row):
            cells += ["absent"] * 3 + ["-"]
        else:
            cells += [_cell(row, k) for k in POOLED_METRICS] + ["-"]
    return "| " + " | ".join(cells) + " |"


def _pooled_notes(pooled: list[dict[str, Any]], settings: list[str]) -> list[str]:
    by_setting = {r["setting"]: r for r in pooled}
    notes = [
        "† pooled: one model of the same architecture and `[train]` recipe, trained for as "
        "many epochs as a Local client (rounds × local_epochs) on the union of all clients' "
        "training splits and scored on each client's test split (the centralized "
        "reference: its final model, no communication)."
    ]
    for setting in settings:
        row = by_setting.get(setting, {})
        if _absent(row):
            why = row.get("absent") or "not run"
            notes.append(f"pooled is absent in {SETTINGS[setting][0]}: {why}.")
    return notes


def plot_convergence(
    results: list[RunResult],
    methods: list[str],
    settings: list[str],
    path: Path,
    pooled: list[dict[str, Any]] | None = None,
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
        reference = next((r for r in pooled or [] if r["setting"] == setting and r["runs"]), None)
        if reference is not None:
            ax.axhline(reference["accuracy"]["mean"], color="black", ls="--", lw=1, label="pooled")
        ax.set_title(SETTINGS[setting][0])
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("mean client accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    figure.savefig(path, dpi=120)


def _parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise MqttflError(f"--{what} needs at least one value")
    return items


def cmd_compare(args: argparse.Namespace) -> int:
    methods = algorithm_names() if args.methods == "all" else _parse_list(args.methods, "methods")
    for method in methods:
        get_algorithm(method_name(method))  # ConfigError naming the known methods
    try:
        seeds = [int(s) for s in _parse_list(args.seeds, "seeds")]
    except ValueError:
        raise MqttflError(
            f"--seeds must be integers separated by commas, got {args.seeds!r}"
        ) from None
    settings = _parse_list(args.settings, "settings")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise MqttflError(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    plan = [(s, m, seed) for s in settings for m in methods for seed in seeds]
    for setting, method, seed in plan:  # every config must load before anything starts
        make_context(load_config(args.config, run_overrides(args.overrides, setting, method, seed)))
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("runs") / f"compare-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    configure_logging(out / "compare.jsonl", level="info", console_level="warning")
    log = get_logger(client_id="compare")
    results = []
    for index, (setting, method, seed) in enumerate(plan, start=1):
        began = time.monotonic()
        result = run_one(
            args.config,
            run_overrides(args.overrides, setting, method, seed),
            RunResult(setting, method, seed, out / setting / method / f"seed-{seed}"),
            resume=args.resume,
        )
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
            else (
                f"acc {result.metrics['accuracy']:.4f}  f1 {result.metrics['f1']:.4f}  "
                f"mae {result.metrics['mae']:.3f}  {result.metrics['kb']:.1f} KB"
            )
        )
        took = "reused a finished run" if result.resumed else f"{seconds} s"
        sys.stdout.write(
            f"[{index}/{len(plan)}] {setting:<5} {method:<32} seed {seed}: {status} ({took})\n"
        )
        sys.stdout.flush()
    pooled_runs = [] if args.no_pooled else _run_pooled_references(args, settings, seeds, out)
    rows = aggregate(results, methods, settings)
    pooled = None if args.no_pooled else aggregate_pooled(pooled_runs, settings)
    (out / "compare.md").write_text(markdown_table(rows, methods, settings, seeds, pooled))
    (out / "compare.json").write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "seeds": seeds,
                "settings": {
                    s: {"title": SETTINGS[s][0], "overrides": SETTINGS[s][1]} for s in settings
                },
                "required_model": {m: model for m in methods if (model := pinned_model(m))},
                "rows": rows,
                "pooled": pooled,
                "pooled_runs": [
                    {
                        "setting": p.setting,
                        "seed": p.seed,
                        "out": str(p.out),
                        "metrics": p.metrics,
                        "per_client": p.per_client,
                        "absent": p.absent,
                    }
                    for p in pooled_runs
                ],
                "runs": [
                    {
                        "setting": r.setting,
                        "method": r.method,
                        "seed": r.seed,
                        "out": str(r.out),
                        "metrics": r.metrics,
                        "curve": {str(t): a for t, a in r.curve.items()},
                        "error": r.error,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n"
    )
    plot_convergence(results, methods, settings, out / "convergence.png", pooled)
    sys.stdout.write((out / "compare.md").read_text() + f"results: {out}\n")
    return 1 if any(r.error for r in results) else 0


def _run_pooled_references(
    args: argparse.Namespace, settings: list[str], seeds: list[int], out: Path
) -> list[PooledRun]:
    log = get_logger(client_id="compare")
    runs = []
    for setting in settings:
        for seed in seeds:
            began = time.monotonic()
            run = run_pooled(
                args.config,
                pooled_overrides(args.overrides, setting, seed),
                PooledRun(setting, seed, out / setting / "pooled" / f"seed-{seed}"),
                resume=args.resume,
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
                else f"acc {run.metrics['accuracy']:.4f}  f1 {run.metrics['f1']:.4f}  "
                f"mae {run.metrics['mae']:.3f}"
            )
            took = "reused" if run.resumed else f"{seconds} s"
            sys.stdout.write(f"[pooled] {setting:<5} seed {seed}: {status} ({took})\n")
            sys.stdout.flush()
    return runs


def add_compare_command(subparsers: Any) -> None:
    """Register ``mqttfl compare`` on the main parser's subcommands."""
    parser = subparsers.add_parser(
        "compare",
        help="run several methods on the same federation and seeds "
        "and tabulate them like FedAPA Table III",
    )
    parser.add_argument("config", help="run config (TOML)")
    parser.add_argument(
        "--methods", default="all", help="'all' or a comma-separated list, e.g. fedavg,fedapa"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--settings",
        default="data,model",
        help="data (statistical heterogeneity) and/or model (tiny/middle/large clients)",
    )
    parser.add_argument("--out", type=Path, help="results directory (default runs/compare-<time>)")
    parser.add_argument(
        "--no-pooled",
        action="store_true",
        help="skip the pooled (centralized) reference row",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse runs in --out that finished with the same config",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key for every run, e.g. --set rounds=10",
    )
    parser.set_defaults(func=cmd_compare)
