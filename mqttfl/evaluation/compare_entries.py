"""One compare entry's run: its overrides, its run directory's results, and --resume.

A compare entry is a registered method, optionally pinned to a model
(``fedavg@transformer``); :mod:`mqttfl.evaluation.compare` runs every (setting, entry, seed) through
:func:`run_one` and tabulates them with :mod:`mqttfl.evaluation.compare_report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttfl.algorithms import algorithm_names, get_algorithm, own_params
from mqttfl.config import load_config
from mqttfl.engine.documents import RunSummary, read_metrics_file, read_summary
from mqttfl.errors import MqttflError

if TYPE_CHECKING:
    from mqttfl.config import RunConfig

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
    absent: str | None = None  # why it cannot run on this data (not run, not a failure)


def run_overrides(base: list[str], setting: str, method: str, seed: int) -> list[str]:
    """The --set list of one run: the user's, then the setting's, method and seed."""
    overrides = [*base, *SETTINGS[setting][1], f"method={method_name(method)}", f"seed={seed}"]
    if model := pinned_model(method):
        overrides += [f"model.name={model}", "model.per_client=[]"]
    return overrides


def read_curve(metrics_path: Path) -> dict[int, float]:
    """Mean accuracy over the clients that reported each round (metrics.jsonl, up to its
    last complete line)."""
    by_round: dict[int, list[float]] = {}
    records, _ = read_metrics_file(metrics_path)
    for record in records:
        by_round.setdefault(record.round, []).append(float(record.accuracy))
    return {t: float(np.mean(values)) for t, values in sorted(by_round.items())}


def summary_metrics(summary: RunSummary) -> dict[str, float]:
    comm, mean = summary.comm, summary.mean
    kb = (comm.up_bytes_per_client_round + comm.down_bytes_per_client_round) / 1000
    return {"accuracy": mean.accuracy, "f1": mean.f1, "mae": mean.mae, "kb": kb}


def finished_summary(out: Path, config: RunConfig) -> RunSummary | None:
    """A finished run's summary in ``out``, if it ran with exactly this config (for --resume)."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = read_summary(path)
    except MqttflError:  # unreadable, malformed or of another version: run it again
        return None
    recorded = summary.config
    if recorded is None or _run_identity(recorded) != _run_identity(config.recorded()):
        return None
    return summary


def _run_identity(recorded: dict[str, Any]) -> dict[str, object]:
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
