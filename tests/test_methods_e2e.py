"""Each method end to end over Mosquitto via `mqttfl run`: every registered method learns
the digits smoke task (3 clients, 3 rounds), FedSAP's phases and model heterogeneity run
on the CSI default, and `mqttfl compare` runs two methods."""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_learning import CONFIG as SMOKE
from benchmarks.bench_learning import majority_shares, method_overrides
from mqttfl.algorithms import algorithm_names
from mqttfl.config import load_config
from mqttfl.evaluation.compare_entries import finished_summary, run_overrides
from tests.helpers import FAST, mqttfl

pytestmark = pytest.mark.slow

# Weight-sharing runs may see a transport re-send, which the gate drops as a duplicate or
# late copy; a schema violation would show up under another reason.
BENIGN = {"duplicate", "stale"}
PROTOTYPE_BYTES = 21 * 256 * 4 + 1000  # the most a prototype upload can carry (CSI default)

# What each method may upload on the smoke task (10 classes, d=128; the CNN has ~180k
# weights). A newly registered method must be placed here.
PROTOTYPES_ONLY = {
    "fedapa",
    "fedapa-global-avg",
    "fedapa-global-avg-client-protos",
    "fedapa-session",
    "fedproto",
    "fedsap",
}
WEIGHTS = {"fedavg", "fedcaring", "fedpam", "wifed", "fedali"}
NOTHING_SHARED = {"local"}
SMOKE_PROTOTYPE_BYTES = 10 * 128 * 4 + 1000
SMOKE_WEIGHT_BYTES = 500_000  # float32 weights of the CNN, well under its 738 KB (FedAli's
# transformer at d=64: 104 KB)

# Learning floors, from python -m benchmarks.bench_learning (every method, seeds 0-2;
# docs/benchmarks/accuracy.md): the worst client of any run scored 0.65 after
# 3 rounds (FedCaring), the mean over clients of any run at least 0.75, and the highest
# majority-class share of a test split is 0.32 (what answering a client's most common
# label scores; 10 classes, so uniform chance is 0.10).
CLIENT_FLOOR = 0.50
MEAN_FLOOR = 0.65


def _overrides(*items: str) -> list[str]:
    return functools.reduce(operator.iadd, (["--set", s] for s in (*FAST, *items)), [])


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _finished(out: Path, result: Any, method: str, rounds: int) -> dict[str, Any]:
    """The run's summary, after checking that it completed every round with every client
    and had no upload rejected for a reason other than a benign re-send."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method
    assert summary["rounds_completed"] == rounds
    assert set(summary["clients"]) == {"0", "1", "2"}
    assert set(summary["rejections"]) <= BENIGN, summary["rejections"]
    assert {(r["round"], r["client_id"]) for r in _records(out)} == {
        (t, c) for t in range(1, rounds + 1) for c in "012"
    }
    return summary


def _run(method: str, out: Path, *extra: str) -> dict[str, Any]:
    """Two rounds of ``method`` on the CSI default made small (no learning expected)."""
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--no-local-reference",
        "--out",
        str(out),
        *_overrides(f"method={method}", "rounds=2", "federation.num_clients=3", *extra),
    )
    return _finished(out, result, method, 2)


def test_every_registered_method_is_classified() -> None:
    assert set(algorithm_names()) == PROTOTYPES_ONLY | WEIGHTS | NOTHING_SHARED


@pytest.mark.parametrize("method", algorithm_names())
def test_every_method_learns(method: str, tmp_path: Path) -> None:
    out = tmp_path / method
    sets = [arg for item in method_overrides(method) for arg in ("--set", item)]
    result = mqttfl("run", SMOKE, "--no-local-reference", "--out", str(out), *sets)
    summary = _finished(out, result, method, 3)
    final = {r["client_id"]: r["accuracy"] for r in _records(out) if r["round"] == 3}
    chance = majority_shares(load_config(SMOKE).seed)
    for client, accuracy in final.items():
        assert accuracy >= max(CLIENT_FLOOR, chance[client] + 0.15), (client, final, chance)
    assert sum(final.values()) / len(final) >= MEAN_FLOOR, final

    up = summary["comm"]["up_bytes_per_client_round"]
    if method == "fedali":  # the transformer's weights plus (16 + 8) local prototypes of
        # width 32 up; its weights plus the global prototypes down
        assert up > 50_000 + (16 + 8) * 32 * 4
        assert up == pytest.approx(summary["comm"]["down_bytes_per_client_round"], rel=0.05)
    elif method in PROTOTYPES_ONLY:
        assert 0 < up < SMOKE_PROTOTYPE_BYTES
    elif method in WEIGHTS:
        assert up > SMOKE_WEIGHT_BYTES
    else:
        assert up < SMOKE_PROTOTYPE_BYTES  # Local: no model leaves the device


def test_prototype_method_across_architectures(tmp_path: Path) -> None:
    summary = _run(
        "fedsap",
        tmp_path / "hetero",
        'model.per_client=["tiny", "middle", "large"]',
        "method.sap_start_round=0",
    )
    assert 0 < summary["comm"]["up_bytes_per_client_round"] < PROTOTYPE_BYTES


def _events(out: Path, client: str, name: str) -> list[dict[str, Any]]:
    lines = (out / "logs" / f"client-{client}.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


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
