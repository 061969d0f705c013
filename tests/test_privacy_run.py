"""[privacy] end to end over Mosquitto via `mqttfl run`: every upload is private and
declared, summary.json gives ε per client from the uploads the coordinator accepted, and
a client whose next upload would exceed its budget leaves the run instead."""

from __future__ import annotations

import functools
import json
import operator
import subprocess
from pathlib import Path

import pytest

from mqttfl.privacy.accountant import epsilon_spent
from tests.faults import read_events
from tests.helpers import FAST, mqttfl

pytestmark = pytest.mark.slow

DP = ["privacy.enabled=true", "privacy.clip=1.0", "privacy.noise_multiplier=0.8"]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    sets = (*FAST, "federation.num_clients=3", "federation.min_clients=1", *DP, *extra)
    return mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--no-local-reference",
        "--out",
        str(out),
        *functools.reduce(operator.iadd, (["--set", s] for s in sets), []),
    )


def test_a_private_run_reports_epsilon_per_client(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _run(out, "rounds=2")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejections"] == {}
    privacy = summary["privacy"]
    assert privacy["uploads"] == {"0": 2, "1": 2, "2": 2}
    for client in "012":
        assert privacy["epsilon"][client] == pytest.approx(epsilon_spent(0.8, 2, 1e-5))
    assert "ε" in result.stdout  # the final table's column


def test_spent_budgets_end_the_run_with_its_summary(tmp_path: Path) -> None:
    """A budget of two uploads and three rounds: after round 2 no client can upload again
    (the coordinator's own count), so the run ends there, exit 0, and its summary and
    final table say why; every client uploaded twice and finished with the run."""
    budget = epsilon_spent(0.8, 2, 1e-5) * 1.0001
    out = tmp_path / "run"
    result = _run(out, "rounds=3", f"privacy.epsilon={budget}", "federation.max_round_attempts=1")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert summary["ended_early"] == "privacy budgets spent after round 2 of 3"
    assert summary["privacy"]["uploads"] == {"0": 2, "1": 2, "2": 2}
    assert "the run ended early: privacy budgets spent after round 2 of 3" in result.stdout
    logs = out / "logs"
    for client in "012":
        events = read_events(logs / f"client-{client}.jsonl")
        assert [e["round"] for e in events if e["event"] == "upload.sent"] == [1, 2]
        assert [e["round"] for e in events if e["event"] == "run.finishing"] == [2]
