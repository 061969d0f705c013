"""One compare entry's run: its overrides, its run directory's results, and --resume.

A compare entry is a registered method, optionally pinned to a model
(``fedavg@transformer``); :mod:`mqttfl.evaluation.compare` runs every (setting, entry, seed) through
:func:`run_one` and tabulates them with :mod:`mqttfl.evaluation.compare_report`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from mqttfl.algorithms import algorithm_names, get_algorithm, own_params
from mqttfl.config import load_config
from mqttfl.errors import MqttflError

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
    return cast("dict[str, Any] | None", summary)


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
    from mqttfl.launch.local import LocalFederation

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
