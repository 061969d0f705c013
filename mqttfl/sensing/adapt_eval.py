"""``mqttfl sense --eval`` for a model that adapts: the run's figure, and the stream's
(and the table ``--eval`` prints for any model).

- **transductive** (the default): one estimate on all the session's windows, as the
  federation evaluates a client (``FedAPASessionClient.predict``); its accuracy, F1 and
  MAE are the run's, digit for digit (tests/test_sense_adapt.py).
- **stream** (``--stream``): the windows fed one by one in their order, each predicted
  with the estimate of the rolling buffer in force when it arrives
  (:class:`~mqttfl.sensing.adapt.StreamAdapter`), as ``mqttfl sense`` runs on a live
  input. Its curve (``--curve PATH``, JSON) gives, after each number n of windows seen:
  the accuracy of the causal readings so far, of the readings since the previous point,
  and of the estimate in force at n applied to every window of the session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.files import write_atomic
from mqttfl.sensing.adapt import Adaptation, Adapter, StreamAdapter
from mqttfl.sensing.spec import SensorSpec


@dataclass
class AdaptiveResult:
    predicted: np.ndarray
    scores: np.ndarray
    adaptation: Adaptation  # the estimate (in stream order: the last one)
    summary: dict[str, object]
    curve: list[dict[str, Any]] = field(default_factory=list)


def transductive(adapter: Adapter, x: np.ndarray, head_output: str) -> AdaptiveResult:
    """One estimate on all of ``x``; the refined assignment where it adapts with
    prototypes (the federation's prediction), else the scores' argmax."""
    adaptation, labels = adapter.adapt(x)
    scores = _scores(adapter, adaptation, x, head_output)
    predicted = scores.argmax(axis=1) if labels is None else np.asarray(labels, np.int64)
    return AdaptiveResult(predicted, scores, adaptation, _describe(adaptation, "transductive"))


def _scores(adapter: Adapter, adaptation: Adaptation, x: np.ndarray, head: str) -> np.ndarray:
    batch = adapter.batch_for(x) if len(x) else 1
    parts = [adapter.scores(adaptation, x[i : i + batch], head) for i in range(0, len(x), batch)]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def _describe(adaptation: Adaptation, mode: str) -> dict[str, object]:
    return {
        "mode": mode,
        "adapted": adaptation.adapted,
        "shift_score": adaptation.score,
        "fit_ratio": adaptation.ratio,
        "adapted_on": adaptation.windows,
        "left_out": adaptation.left_out,
    }


def checkpoints(n: int, first: int) -> list[int]:
    """Windows-seen points of the curve: the first estimate, then about x1.5 apart, and n."""
    points: list[int] = []
    at = max(1, first)
    while at < n:
        points.append(at)
        at = max(at + 1, round(at * 1.5))
    return [*points, n] if n else points


def stream(
    stream_adapter: StreamAdapter,
    x: np.ndarray,
    y: np.ndarray,
    period_s: float,
    head_output: str,
) -> AdaptiveResult:
    """Feed ``x`` one window at a time (``period_s`` apart); score each with the estimate
    in force; the curve of the module docstring."""
    adapter = stream_adapter.adapter
    predicted = np.zeros(len(x), np.int64)
    rows: list[np.ndarray] = []
    adapted = np.zeros(len(x), bool)
    points = set(checkpoints(len(x), adapter.spec.min_adapt_windows))
    curve: list[dict[str, Any]] = []
    previous = 0
    for i in range(len(x)):
        row = stream_adapter.read(x[i], i * period_s, head_output)
        current = stream_adapter.current
        rows.append(row)
        predicted[i] = int(row.argmax())
        adapted[i] = current.adapted
        seen = i + 1
        if seen in points:
            whole = _scores(adapter, current, x, head_output).argmax(axis=1)
            curve.append(
                {
                    "windows_seen": seen,
                    "stream_accuracy": float(np.mean(predicted[:seen] == y[:seen])),
                    "recent_accuracy": float(np.mean(predicted[previous:seen] == y[previous:seen])),
                    "estimate_accuracy_on_session": float(np.mean(whole == y)),
                    "adapted": current.adapted,
                    "shift_score": current.score,
                    "fit_ratio": current.ratio,
                    "left_out": current.left_out,
                    "buffer": stream_adapter.held(),
                }
            )
            previous = seen
    summary = _describe(stream_adapter.current, "stream")
    summary.update(
        {
            "adapted_readings": int(adapted.sum()),
            "estimates": stream_adapter.estimates,
            "buffer": stream_adapter.size,
            "every": stream_adapter.every,
            "horizon_s": stream_adapter.horizon_s,
        }
    )
    scores = np.stack(rows) if rows else np.zeros((0, 0), np.float32)
    return AdaptiveResult(predicted, scores, stream_adapter.current, summary, curve)


def evaluate(
    stream_adapter: StreamAdapter,
    spec: SensorSpec,
    x: np.ndarray,
    y: np.ndarray,
    in_stream: bool,
    curve: Path | None,
) -> AdaptiveResult:
    """``--eval`` (transductive) or ``--eval --stream`` (windows ``stride / packet rate``
    apart); the curve written to ``curve`` (JSON) when given."""
    if in_stream:
        pre = spec.preprocess
        period = pre.stride / pre.sample_rate_hz if pre.sample_rate_hz else 1.0
        result = stream(stream_adapter, x, y, period, spec.output_name)
    else:
        result = transductive(stream_adapter.adapter, x, spec.output_name)
    if curve is not None:
        document = {**result.summary, "windows": len(x), "curve": result.curve}
        write_atomic(Path(curve), (json.dumps(document, indent=2) + "\n").encode())
    return result


def table(result: dict[str, Any]) -> str:
    """What ``--eval`` prints for any model: the run's figures beside sense's, and for a
    model that adapts how it did."""
    run = result["run"]
    lines = [f"{'':10}{'run':>10}{'sense':>10}"]
    for key in ("accuracy", "f1", "mae"):
        theirs = f"{run[key]:.4f}" if key in run else "-"
        lines.append(f"{key:10}{theirs:>10}{result[key]:>10.4f}")
    lines.append(
        f"{result['windows']} windows; run: round {run.get('round', '?')} of metrics.jsonl"
    )
    if "mode" in result:
        lines.append(describe_line(result))
    return "\n".join(lines)


def describe_line(result: dict[str, Any]) -> str:
    """One line under ``--eval``'s table: how the adapting model predicted."""

    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    adapted = "adapted" if result["adapted"] else "not adapted (trained statistics)"
    figures = f"shift score {shown(result['shift_score'])}, fit ratio {shown(result['fit_ratio'])}"
    if result.get("left_out"):
        figures += f", {result['left_out']} windows left out of the estimate"
    if result["mode"] == "stream":
        return (
            f"stream order, buffer {result['buffer']}: {result['adapted_readings']} readings "
            f"adapted, {result['estimates']} estimates; the last {adapted} ({figures})"
        )
    return f"once on all {result['adapted_on']} windows: {adapted} ({figures})"
