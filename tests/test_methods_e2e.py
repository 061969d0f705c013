"""Each method end to end over Mosquitto via `mqttfl run` (2 rounds, 3 clients), and
`mqttfl compare` on two methods."""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path
from typing import Any

import pytest

from mqttfl.config import load_config
from mqttfl.evaluation.compare_entries import finished_summary, run_overrides
from tests.helpers import FAST, mqttfl

pytestmark = pytest.mark.slow

# Weight-sharing runs may see a transport re-send, which the gate drops as a duplicate or
# late copy; a schema violation would show up under another reason.
BENIGN = {"duplicate", "stale"}
PROTOTYPE_BYTES = 21 * 256 * 4 + 1000  # the most a prototype upload can carry


def _overrides(*items: str) -> list[str]:
    return functools.reduce(operator.iadd, (["--set", s] for s in (*FAST, *items)), [])


def _run(method: str, out: Path, *extra: str) -> dict[str, Any]:
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        *_overrides(f"method={method}", "rounds=2", "federation.num_clients=3", *extra),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method
    assert summary["rounds_completed"] == 2
    assert set(summary["clients"]) == {"0", "1", "2"}
    assert set(summary["rejections"]) <= BENIGN, summary["rejections"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {(r["round"], r["client_id"]) for r in records} == {
        (t, c) for t in (1, 2) for c in "012"
    }
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in records)
    return summary


def _events(out: Path, client: str, name: str) -> list[dict[str, Any]]:
    lines = (out / "logs" / f"client-{client}.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


@pytest.mark.parametrize("method", ["fedproto", "fedsap"])
def test_prototype_methods_upload_prototypes_only(method: str, tmp_path: Path) -> None:
    summary = _run(method, tmp_path / method)
    assert 0 < summary["comm"]["up_bytes_per_client_round"] < PROTOTYPE_BYTES


def test_prototype_method_across_architectures(tmp_path: Path) -> None:
    summary = _run(
        "fedsap",
        tmp_path / "hetero",
        'model.per_client=["tiny", "middle", "large"]',
        "method.sap_start_round=0",
    )
    assert summary["comm"]["up_bytes_per_client_round"] < PROTOTYPE_BYTES


@pytest.mark.parametrize("method", ["fedpam", "wifed", "fedcaring"])
def test_weight_sharing_baselines(method: str, tmp_path: Path) -> None:
    summary = _run(method, tmp_path / method)
    assert summary["comm"]["up_bytes_per_client_round"] > 50_000  # MiddleConvNet4's weights


def test_fedali_on_the_transformer(tmp_path: Path) -> None:
    summary = _run(
        "fedali",
        tmp_path / "fedali",
        "model.name=transformer",
        "model.embed_dim=64",
        "method.prototype_counts=[16, 8]",
    )
    comm = summary["comm"]
    # weights plus (16 + 8) local prototypes of width 32 up; weights plus global ones down
    assert comm["up_bytes_per_client_round"] > (16 + 8) * 32 * 4
    assert comm["up_bytes_per_client_round"] == pytest.approx(
        comm["down_bytes_per_client_round"], rel=0.05
    )


def test_fedsap_semi_supervised_phase(tmp_path: Path) -> None:
    out = tmp_path / "semi"
    summary = _run(
        "fedsap",
        out,
        "method.semi_supervised=true",
        "method.supervised_rounds=1",
        "method.sap_start_round=0",
        "method.unlabelled_fraction=0.3",
    )
    assert summary["comm"]["up_bytes_per_client_round"] < PROTOTYPE_BYTES
    for client in "012":
        calibrated = _events(out, client, "fedsap.thresholds_calibrated")
        assert [e["round"] for e in calibrated] == [2]  # once, at the end of the supervised phase
        pseudo = _events(out, client, "fedsap.pseudo_labels")
        assert [e["round"] for e in pseudo] == [2]
        assert pseudo[0]["seen"] > 0


def test_compare_two_methods(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    result = mqttfl(
        "compare",
        "configs/fedapa-csi.toml",
        "--methods",
        "fedproto,fedali",
        "--seeds",
        "0",
        "--out",
        str(out),
        *_overrides("rounds=2", "federation.num_clients=3", "method.prototype_counts=[16, 8]"),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    table = (out / "compare.md").read_text()
    assert "Statistical Data: Acc. (%)" in table
    assert "Model Architecture: KB" in table
    assert "fedali *" in table
    assert "needs model `transformer`" in table
    data = json.loads((out / "compare.json").read_text())
    rows = {(r["method"], r["setting"]): r for r in data["rows"]}
    assert set(rows) == {(m, s) for m in ("fedproto", "fedali") for s in ("data", "model")}
    for row in rows.values():
        assert row["runs"] == 1
        assert row["accuracy"]["std"] == 0.0
        assert row["kb"]["mean"] > 0
    assert rows[("fedproto", "data")]["kb"]["mean"] < rows[("fedali", "data")]["kb"]["mean"]
    hetero = json.loads((out / "model" / "fedproto" / "seed-0" / "summary.json").read_text())
    assert hetero["config"]["model"]["per_client"] == ["tiny", "middle", "large"]
    fedali = json.loads((out / "model" / "fedali" / "seed-0" / "summary.json").read_text())
    assert fedali["config"]["model"]["name"] == "transformer"
    assert fedali["config"]["model"]["per_client"] == []
    assert all(set(run["curve"]) == {"1", "2"} for run in data["runs"])
    assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --resume reuses the runs that finished with the same config, and only those.
    args = [
        "compare",
        "configs/fedapa-csi.toml",
        "--methods",
        "fedproto,fedali",
        "--seeds",
        "0",
        "--out",
        str(out),
        *_overrides("rounds=2", "federation.num_clients=3", "method.prototype_counts=[16, 8]"),
    ]
    again = mqttfl(*args, "--resume")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert again.stdout.count("reused a finished run") == 4
    assert json.loads((out / "compare.json").read_text())["rows"] == data["rows"]
    run_dir = out / "data" / "fedproto" / "seed-0"
    same = load_config(
        "configs/fedapa-csi.toml",
        run_overrides(
            [*FAST, "rounds=2", "federation.num_clients=3", "method.prototype_counts=[16, 8]"],
            "data",
            "fedproto",
            0,
        ),
    )
    assert finished_summary(run_dir, same) is not None
    assert finished_summary(run_dir, same.model_copy(update={"rounds": 3})) is None
