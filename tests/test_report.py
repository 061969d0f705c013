"""`mqttfl report` on the outputs of a tiny real run (a real broker, coordinator and clients)."""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path

import pytest

from tests.helpers import FAST, mqttfl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    overrides = [*FAST, "rounds=2", "federation.num_clients=2", "method=fedapa"]
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        *functools.reduce(operator.iadd, (["--set", s] for s in overrides), []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_report_renders_tables_and_plots_from_a_run(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = mqttfl("report", str(tiny_run), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]

    summary = json.loads((tiny_run / "summary.json").read_text())
    markdown = (out / "report.md").read_text()
    assert markdown == result.stdout.split("\nreport: ")[0]
    method_row = next(
        line for line in markdown.splitlines() if line.startswith("| fedapa | session | 1 |")
    )
    assert f"{summary['mean']['accuracy'] * 100:.2f} ± 0.00" in method_row
    assert f"{summary['comm']['up_bytes_per_client_round'] / 1000:.2f} ± 0.00" in method_row
    for client in ("0", "1"):
        row = summary["clients"][client]
        assert f"| {client} | {row['accuracy'] * 100:.2f} | {row['f1'] * 100:.2f} |" in markdown
    for name in ("accuracy.png", "bytes.png", "clients.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in markdown

    data = json.loads((out / "report.json").read_text())
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in records if r["round"] == 1]
    assert data["accuracy_per_round"]["fedapa"]["1"] == pytest.approx(
        sum(r["accuracy"] for r in first) / len(first)
    )
    assert data["kb_per_round"]["fedapa"]["2"] == pytest.approx(
        sum(r["bytes_up"] + r["bytes_down"] for r in records if r["round"] == 2) / 1000
    )
    assert set(data["client_accuracy"]["fedapa"]) == {"0", "1"}


def test_report_finds_runs_below_a_folder_and_defaults_its_output(tiny_run: Path) -> None:
    result = mqttfl("report", str(tiny_run.parent))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| run | fedapa | session | 2 | 2 |" in result.stdout
    assert (tiny_run.parent / "report" / "report.md").is_file()


def test_report_without_runs_is_one_clear_line(tmp_path: Path) -> None:
    result = mqttfl("report", str(tmp_path))
    assert result.returncode == 2
    assert "no run directory" in result.stderr
    assert str(tmp_path) in result.stderr
    assert "Traceback" not in result.stderr
