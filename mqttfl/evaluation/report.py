"""`mqttfl report`: markdown tables and PNG plots from the outputs of finished runs.

Reads each run directory's ``summary.json`` and ``metrics.jsonl`` (a directory without a
summary is searched for run directories below it, so a ``mqttfl compare`` output works
too), each checked as :mod:`mqttfl.engine.documents` reads it (a malformed file is one line
naming it; a last line cut short by a killed coordinator is left out), and writes to
``--out``:

- ``report.md``: one row per method (mean ± std over its runs of the last-5-round means,
  and payload KB per client-round up and down), one row per run, and each run's
  per-client table;
- ``accuracy.png``: mean client accuracy per round, one line per method (averaged over
  its runs);
- ``bytes.png``: payload KB per round (all clients, up and down), one line per method;
- ``clients.png``: per-client accuracy bars, one group per client, one bar per method;
- ``report.json``: the numbers behind all of it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from itertools import zip_longest
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from mqttfl.engine.documents import (
    ClientRow,
    MetricsLine,
    PrivacyBlock,
    RunSummary,
    read_metrics_file,
    read_summary,
)
from mqttfl.errors import FileError
from mqttfl.files import write_atomic
from mqttfl.wire.ids import client_order


@dataclass
class RunData:
    path: Path
    summary: RunSummary
    records: list[MetricsLine]

    @property
    def method(self) -> str:
        return self.summary.method

    @property
    def label(self) -> str:
        return self.path.name

    def per_round(self, key: str, how: str = "mean") -> dict[int, float]:
        by_round: dict[int, list[float]] = defaultdict(list)
        for record in self.records:
            value = record.value(key)
            if value is not None:
                by_round[record.round].append(value)
        reduce = np.sum if how == "sum" else np.mean
        return {t: float(reduce(values)) for t, values in sorted(by_round.items())}


def find_runs(paths: list[Path]) -> list[RunData]:
    """Every run directory (one holding summary.json) given or below the given paths."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise FileError(f"not a directory: {path}")
        if (path / "summary.json").is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.rglob("summary.json")))
    if not found:
        raise FileError(f"no run directory (with summary.json) in {', '.join(map(str, paths))}")
    runs = []
    for path in dict.fromkeys(found):
        summary = read_summary(path / "summary.json")
        records, _ = read_metrics_file(path / "metrics.jsonl")
        runs.append(RunData(path, summary, records))
    return runs


def _mean_std(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


@dataclass(frozen=True)
class MethodRow:
    """A method's (and split's) row: mean ± std over its runs (report.json's ``methods``)."""

    method: str
    split: str
    runs: int
    accuracy: tuple[float, float]
    f1: tuple[float, float]
    mae: tuple[float, float]
    shows_mae: bool
    kb_up: tuple[float, float]  # payload KB per client-round
    kb_down: tuple[float, float]


def method_rows(runs: list[RunData]) -> list[MethodRow]:
    """Per method: mean ± std over its runs of accuracy, F1, MAE and KB per client-round."""
    by_method: dict[tuple[str, str], list[RunData]] = defaultdict(list)
    for run in runs:
        by_method[(run.method, run.summary.data_split)].append(run)
    rows = []
    for (method, split), members in by_method.items():
        means = [r.summary.mean for r in members]
        comms = [r.summary.comm for r in members]
        rows.append(
            MethodRow(
                method=method,
                split=split,
                runs=len(members),
                accuracy=_mean_std([m.accuracy for m in means]),
                f1=_mean_std([m.f1 for m in means]),
                mae=_mean_std([m.mae for m in means]),
                shows_mae=all(r.summary.shows_mae for r in members),
                kb_up=_mean_std([c.up_bytes_per_client_round / 1000 for c in comms]),
                kb_down=_mean_std([c.down_bytes_per_client_round / 1000 for c in comms]),
            )
        )
    return rows


def _pm(pair: tuple[float, float], scale: float = 1.0, digits: int = 2) -> str:
    mean, std = pair
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


def render_markdown(runs: list[RunData], rows: list[MethodRow]) -> str:
    lines = [
        "# mqttfl report",
        "",
        f"{len(runs)} run(s). Accuracy, F1 (%) and MAE are each run's mean over clients of the last "
        "five rounds; methods show mean ± std over their runs. KB: payload per client-round.",
        "",
        "## Methods",
        "",
        "| method | split | runs | Acc. (%) | F1 (%) | MAE | KB up | KB down |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mae = _pm(row.mae, digits=3) if row.shows_mae else "-"
        lines.append(
            f"| {row.method} | {row.split} | {row.runs} | {_pm(row.accuracy, 100)} | "
            f"{_pm(row.f1, 100)} | {mae} | {_pm(row.kb_up)} | {_pm(row.kb_down)} |"
        )
    lines += [
        "",
        "## Runs",
        "",
        "MAE only where labels are counts. Split: window (test windows from the sessions a "
        "client trained on) or session (test sessions it never trained on). Local: each "
        "client trained alone; gain: accuracy - Local.",
        "",
        "| run | method | split | rounds | clients | Acc. (%) | Local (%) | gain (pp) | F1 (%) | "
        "MAE | KB up | KB down | rejected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        summary = run.summary
        mean, comm = summary.mean, summary.comm
        rejected = sum(summary.rejections.values())
        local, gain = _reference_cells(summary, None)
        mae = f"{mean.mae:.3f}" if summary.shows_mae else "-"
        lines.append(
            f"| {run.label} | {run.method} | {summary.data_split} | "
            f"{summary.rounds_completed} | "
            f"{len(summary.clients)} | {mean.accuracy * 100:.2f} | {local} | "
            f"{gain} | {mean.f1 * 100:.2f} | "
            f"{mae} | {comm.up_bytes_per_client_round / 1000:.2f} | "
            f"{comm.down_bytes_per_client_round / 1000:.2f} | {rejected} |"
        )
    for run in runs:
        lines += [
            "",
            f"### {run.label} ({run.method}, {run.summary.data_split} split): per client",
            "",
            "| client | Acc. (%) | Local (%) | gain (pp) | F1 (%) | MAE | KB sent | KB received "
            "| uploaded / selected | left, back (round) | figures of rounds |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for client, scores in run.summary.clients.items():
            local, gain = _reference_cells(run.summary, client)
            mae = f"{scores.mae:.3f}" if run.summary.shows_mae else "-"
            lines.append(
                f"| {client} | {scores.accuracy * 100:.2f} | {local} | {gain} | "
                f"{scores.f1 * 100:.2f} | {mae} | "
                f"{scores.kb_sent:.1f} | {scores.kb_received:.1f} | {_part_cells(scores)} |"
            )
        if _has_dropouts(run):
            lines += ["", f"![{run.label}: each client's accuracy]({_clients_plot(run)})"]
        lines += privacy_lines(run.summary.privacy)
    lines += [
        "",
        "![accuracy per round](accuracy.png)",
        "",
        "![bytes per round](bytes.png)",
        "",
        "![per-client accuracy](clients.png)",
        "",
    ]
    return "\n".join(lines)


def privacy_lines(privacy: PrivacyBlock | None) -> list[str]:
    """ε per client of a run with [privacy] on (nothing otherwise)."""
    if privacy is None:
        return []
    lines = [
        "",
        f"Differential privacy: δ={privacy.delta:g}, clip {privacy.clip:g}, noise "
        f"multiplier {privacy.noise_multiplier:.3f}, budget ε={privacy.budget}.",
        "",
        "| client | uploads | ε |",
        "|---|---|---|",
    ]
    for client, spent in privacy.epsilon.items():
        lines.append(f"| {client} | {privacy.uploads.get(client, 0)} | {spent:.3f} |")
    return lines


def _reference_cells(summary: RunSummary, client: str | None) -> tuple[str, str]:
    """Local accuracy (%) and gain (percentage points) of a client, or of the mean
    (``None``), where the summary holds a Local reference; "-" where it does not."""
    reference = summary.local_reference
    if reference is None:
        return "-", "-"
    scores = reference.mean if client is None else reference.clients.get(client)
    local = None if scores is None else scores.accuracy
    gain = reference.gain.mean if client is None else reference.gain.clients.get(client)
    if local is None or gain is None:
        return "-", "-"
    return f"{local * 100:.2f}", f"{gain * 100:+.2f}"


def _method_curves(runs: list[RunData], key: str, how: str) -> dict[str, dict[int, float]]:
    """Per method, the per-round value averaged over its runs."""
    grouped: dict[str, list[dict[int, float]]] = defaultdict(list)
    for run in runs:
        curve = run.per_round(key, how)
        if curve:
            grouped[run.method].append(curve)
    out = {}
    for method, curves in grouped.items():
        rounds = sorted(set().union(*curves))
        out[method] = {t: float(np.mean([c[t] for c in curves if t in c])) for t in rounds}
    return out


def _line_plot(curves: dict[str, dict[int, float]], ylabel: str, title: str, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.subplots()
    for method, curve in sorted(curves.items()):
        rounds = list(curve)
        ax.plot(
            rounds, list(curve.values()), marker="o" if len(rounds) < 15 else None, label=method
        )
    values = [v for curve in curves.values() for v in curve.values() if v > 0]
    if values and max(values) > 20 * min(values):  # e.g. weights next to prototypes
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)


def _client_bars(runs: list[RunData], path: Path) -> dict[str, dict[str, float]]:
    from matplotlib.figure import Figure

    grouped: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for client, row in run.summary.clients.items():
            grouped[run.method][client].append(row.accuracy)
    bars = {m: {c: float(np.mean(v)) for c, v in clients.items()} for m, clients in grouped.items()}
    clients = sorted(
        {c for per in bars.values() for c in per},
        key=client_order,
    )
    figure = Figure(figsize=(max(6.0, 0.9 * len(clients) + 2), 4.2), layout="constrained")
    ax = figure.subplots()
    width = 0.8 / max(len(bars), 1)
    x = np.arange(len(clients))
    for index, (method, per) in enumerate(sorted(bars.items())):
        ax.bar(
            x + index * width - 0.4 + width / 2,
            [per.get(c, 0.0) for c in clients],
            width,
            label=method,
        )
    ax.set_xticks(x, clients)
    ax.set_xlabel("client")
    ax.set_ylabel("accuracy (last 5 rounds)")
    ax.set_ylim(0, 1)
    ax.set_title("Per-client accuracy")
    ax.grid(alpha=0.3, axis="y")
    if bars:
        ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)
    return bars


def _part_cells(row: ClientRow) -> str:
    """``uploaded / selected | left, back | figures of rounds`` ("-" where not recorded)."""
    sel = f"{row.uploaded} / {row.selected}" if row.selected is not None else "-"
    moves = [
        f"{gone}" + (f", {back}" if back is not None else ", -")
        for gone, back in zip_longest(row.left or [], row.rejoined or [])
    ]
    covered = row.last_rounds or []
    span = f"{covered[0]}-{covered[-1]}" if covered else "-"
    return f"{sel} | {'; '.join(moves) or '-'} | {span}"


def _has_dropouts(run: RunData) -> bool:
    return any(row.left for row in run.summary.clients.values())


def _clients_plot(run: RunData) -> str:
    return f"clients-{run.label}.png"


def _client_curves(run: RunData, path: Path) -> None:
    """Each client's accuracy per round, with the rounds it left (▼) and came back (▲)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.subplots()
    for client, row in run.summary.clients.items():
        curve = {r.round: r.accuracy for r in run.records if r.client_id == client}
        (line,) = ax.plot(list(curve), list(curve.values()), label=f"client {client}")
        for marks, shape in ((row.left or [], "v"), (row.rejoined or [], "^")):
            ys = [curve.get(t, curve.get(t - 1, 0.0)) for t in marks]
            ax.scatter(marks, ys, marker=shape, s=70, color=line.get_color(), zorder=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round (▼ left, ▲ back)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{run.label}: each client's accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figure.savefig(path, dpi=110)


def _as_read(part: BaseModel) -> dict[str, object]:
    """A part of a summary as summary.json holds it (its keys, sorted)."""
    return dict(sorted(part.model_dump(exclude_unset=True).items()))


def write_report(paths: list[Path], out: Path) -> Path:
    """Render the report of the runs under ``paths`` into ``out``; return report.md."""
    runs = find_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    rows = method_rows(runs)
    accuracy = _method_curves(runs, "accuracy", "mean")
    up = _method_curves(runs, "bytes_up", "sum")
    down = _method_curves(runs, "bytes_down", "sum")
    kb = {
        m: {
            t: (up.get(m, {}).get(t, 0.0) + down.get(m, {}).get(t, 0.0)) / 1000
            for t in sorted(set(up.get(m, {})) | set(down.get(m, {})))
        }
        for m in set(up) | set(down)
    }
    _line_plot(accuracy, "mean client accuracy", "Accuracy per round", out / "accuracy.png")
    _line_plot(kb, "KB per round (all clients, up + down)", "Bytes per round", out / "bytes.png")
    bars = _client_bars(runs, out / "clients.png")
    for run in filter(_has_dropouts, runs):
        _client_curves(run, out / _clients_plot(run))
    write_atomic(out / "report.md", render_markdown(runs, rows).encode())
    report = (
        json.dumps(
            {
                "runs": [
                    {
                        "path": str(r.path),
                        "method": r.method,
                        "split": r.summary.data_split,
                        "mean": _as_read(r.summary.mean),
                        "comm": _as_read(r.summary.comm),
                        "clients": {c: _as_read(row) for c, row in r.summary.clients.items()},
                    }
                    for r in runs
                ],
                "methods": [asdict(row) for row in rows],
                "accuracy_per_round": {
                    m: {str(t): v for t, v in c.items()} for m, c in accuracy.items()
                },
                "kb_per_round": {m: {str(t): v for t, v in c.items()} for m, c in kb.items()},
                "client_accuracy": bars,
            },
            indent=2,
        )
        + "\n"
    )
    write_atomic(out / "report.json", report.encode())
    return out / "report.md"
