"""`mqttfl run` end to end: real mosquitto, a real coordinator and client processes."""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path

import pytest

from tests.helpers import FAST, mqttfl, processes_mentioning

pytestmark = pytest.mark.slow


def test_run_end_to_end(tmp_path: Path) -> None:
    # Every method's learning and payloads: tests/test_methods_e2e.py. This is the default
    # job's path: its broker, credentials, logs, metrics and processes.
    method = "fedapa"
    out = tmp_path / "run"
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--no-local-reference",  # tests/test_reference.py and test_report.py cover it
        "--out",
        str(out),
        "--set",
        f"method={method}",
        "--set",
        "rounds=3",
        "--set",
        "federation.num_clients=3",
        *functools.reduce(operator.iadd, (["--set", s] for s in FAST), []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr

    summary = json.loads((out / "summary.json").read_text())
    # The run's broker credentials stay in the broker's private files, never in results.
    text = (out / "summary.json").read_text()
    for env in (out / "broker" / "credentials").glob("*.env"):
        password = env.read_text().split("MQTTFL_BROKER__PASSWORD=")[1].split()[0]
        assert password not in text
    assert "broker" not in summary["config"]
    assert summary["method"] == method
    assert summary["rounds_completed"] == 3
    assert set(summary["clients"]) == {"0", "1", "2"}
    assert set(summary["mean"]) == {"accuracy", "f1", "mae"}
    comm = summary["comm"]
    assert comm["up_bytes_per_client_round"] > 0
    assert comm["down_bytes_per_client_round"] > 0
    assert comm["up_bytes_per_client_round"] < 21 * 256 * 4 + 1000  # 21 x 256 float32 at most
    assert summary["rejections"] == {}

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {(r["round"], r["client_id"]) for r in records} == {
        (t, c) for t in (1, 2, 3) for c in "012"
    }

    logs = out / "logs"
    assert {p.name for p in logs.glob("*.jsonl")} >= {
        "coordinator.jsonl",
        "client-0.jsonl",
        "client-2.jsonl",
    }
    events = [json.loads(line) for line in (logs / "coordinator.jsonl").read_text().splitlines()]
    closed = [e for e in events if e["event"] == "round.closed"]
    assert [e["round"] for e in closed] == [1, 2, 3]
    assert all(e["run_id"] == "fedapa-csi" and e["client_id"] == "coordinator" for e in closed)
    client_events = [
        json.loads(line) for line in (logs / "client-1.jsonl").read_text().splitlines()
    ]
    assert any(
        e["event"] == "upload.sent" and e["round"] == 1 and e["client_id"] == "1"
        for e in client_events
    )

    assert processes_mentioning(str(out)) == []


def test_bad_config_key_is_one_clear_line(tmp_path: Path) -> None:
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(tmp_path / "x"),
        "--set",
        "federation.bogus=1",
    )
    assert result.returncode == 2
    assert "federation.bogus" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()


def test_missing_config_file_names_the_path(tmp_path: Path) -> None:
    result = mqttfl("run", str(tmp_path / "missing.toml"))
    assert result.returncode == 2
    assert "missing.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_models_lists_paper_parameter_counts() -> None:
    result = mqttfl("models", "--num-classes", "20", "--input", "1000x242", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["tiny"]["parameters"] == 7_956
    assert rows["middle"]["parameters"] == 18_436
    assert rows["large"]["parameters"] == 463_748
    assert rows["large"]["flops"] > rows["middle"]["flops"] > 0
