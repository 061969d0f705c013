"""Real-data federations that ship with configs run end to end over Mosquitto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._shared_data import require_shared
from tests.helpers import mqttfl

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["fedapa", "fedavg"])
def test_espectre_presence_federation_two_rounds(method: str, tmp_path: Path) -> None:
    root = require_shared("espectre")
    out = tmp_path / "run"
    result = mqttfl(
        "run",
        "--no-local-reference",
        "configs/presence-espectre.toml",
        "--out",
        str(out),
        "--set",
        "rounds=2",
        "--set",
        f"method={method}",
        "--set",
        f"data.path={root.parent}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["clients"]) == {"0", "1", "2", "3", "4"}  # one client per chip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["round"] for r in records} == {1, 2}


def test_prepared_intel5300_shards_train_in_a_federation(tmp_path: Path) -> None:
    recordings = require_shared("csi-samples", "intel5300-activity")
    shards, out = tmp_path / "shards", tmp_path / "run"
    inputs = sorted(str(p) for p in recordings.glob("*/*.dat"))
    prepared = mqttfl(
        "data",
        "prepare",
        "--format",
        "intel5300",
        "--input",
        *inputs,
        "--label",
        "filename",
        "--group-by",
        "dir",
        "--window",
        "50",
        "--normalize",
        "--out",
        str(shards),
    )
    assert prepared.returncode == 0, prepared.stderr
    clients = sorted(p.name for p in shards.iterdir())
    assert clients == ["client-0", "client-1"]  # one client per month folder
    result = mqttfl(
        "run",
        "--no-local-reference",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        "--set",
        "rounds=2",
        "--set",
        "data.source=shards",
        "--set",
        f"data.path={shards}",
        "--set",
        "federation.num_clients=2",
        "--set",
        "model.num_classes=6",
        "--set",
        "model.name=middle",
        "--set",
        "data.split=window",  # the shards were prepared with the window split
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["clients"]) == {"0", "1"}
    assert summary["comm"]["up_bytes_per_client_round"] > 0


@pytest.mark.parametrize("config", ["configs/digits-fedsap.toml", "configs/mnist-fedpam.toml"])
def test_image_configs_run_out_of_the_box(config: str, tmp_path: Path) -> None:
    # Its data, model and recipe load and run; learning is test_methods_e2e's.
    out = tmp_path / "run"
    result = mqttfl(
        "run",
        config,
        "--no-local-reference",
        "--out",
        str(out),
        "--set",
        "rounds=1",
        "--set",
        "federation.num_clients=3",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["clients"]) == {"0", "1", "2"}
