"""The Local reference beside `mqttfl run`'s table (mqttfl.evaluation.reference): it is what a Local
run of the same federation reports, it is cached by what determines it, and the table
shows it with the gain."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import MutableMapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from mqttfl.config import load_config
from mqttfl.engine.documents import RunSummary
from mqttfl.evaluation import reference as reference_module
from mqttfl.evaluation.pooled import client_shards
from mqttfl.evaluation.reference import (
    LocalReference,
    local_reference,
    reference_key,
    reference_processes,
    train_local_reference,
    with_reference,
)
from mqttfl.evaluation.table import format_table
from tests.helpers import FAST, mqttfl

CONFIG = "configs/fedapa-csi.toml"
TINY = [*FAST, "rounds=2", "federation.num_clients=2"]
# Three clients, two of them trained per round: the reference must select as the
# coordinator does.
SELECTING = [*FAST, "rounds=3", "federation.num_clients=3", "federation.fraction=0.5"]


def _run(out: Path, *items: str, flags: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    sets = [arg for item in (*SELECTING, *items) for arg in ("--set", item)]
    result = mqttfl("run", CONFIG, "--out", str(out), *flags, *sets)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stdout, json.loads((out / "summary.json").read_text())


def _reference_events(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("reference.")]


@pytest.mark.slow
def test_the_reference_is_what_a_local_run_reports(tmp_path: Path, reference_cache: Path) -> None:
    stdout, federated = _run(tmp_path / "fedavg", "method=fedavg")
    reference = federated["local_reference"]
    assert reference["source"] == "trained"
    assert Path(reference["cache"]).parent == reference_cache / "local-reference"
    assert Path(reference["cache"]).is_file()
    # the table follows the run's progress lines
    header = next(line.split() for line in stdout.splitlines() if line.split()[:1] == ["client"])
    assert header[:4] == ["client", "accuracy", "local", "gain"]
    for client, row in federated["clients"].items():
        gain = row["accuracy"] - reference["clients"][client]["accuracy"]
        assert reference["gain"]["clients"][client] == pytest.approx(gain)

    stdout, local = _run(tmp_path / "local", "method=local")
    assert "local_reference" not in local
    assert "gain" not in stdout
    assert set(local["clients"]) == set(reference["clients"]) == {"0", "1", "2"}
    for client, row in local["clients"].items():
        assert {k: row[k] for k in ("accuracy", "f1", "mae")} == reference["clients"][client]

    stdout, skipped = _run(tmp_path / "fedapa", "method=fedapa", flags=("--no-local-reference",))
    assert "local_reference" not in skipped
    assert "gain" not in stdout
    # Another method, same federation: the CLI's cached reference is this one.
    again = local_reference(load_config(CONFIG, [*SELECTING, "method=fedapa"]))
    assert (again.source, again.key, str(again.path)) == (
        "cached",
        reference["key"],
        reference["cache"],
    )


def test_the_cache_is_hit_for_the_same_federation_and_missed_for_another_seed(
    tmp_path: Path,
) -> None:
    config = load_config(CONFIG, [*TINY, "method=fedapa"])
    other_method = load_config(
        CONFIG, [*TINY, "method=fedavg", "run_id=other", "broker.keepalive_s=30"]
    )
    with capture_logs() as logs:
        first = local_reference(config, cache_dir=tmp_path)
        again = local_reference(other_method, cache_dir=tmp_path)
        reseeded = local_reference(load_config(CONFIG, [*TINY, "seed=1"]), cache_dir=tmp_path)
    assert _reference_events(logs) == [
        "reference.training",
        "reference.trained",
        "reference.cached",
        "reference.training",
        "reference.trained",
    ]
    assert (first.source, again.source, reseeded.source) == ("trained", "cached", "trained")
    assert again.clients == first.clients
    assert set(first.clients) == {"0", "1"}
    assert (again.key, again.path, again.seconds) == (first.key, first.path, first.seconds)
    assert reseeded.key != first.key
    assert sorted(p.name for p in (tmp_path / "local-reference").iterdir()) == sorted(
        [f"{first.key}.json", f"{reseeded.key}.json"]
    )

    assert first.path is not None
    first.path.write_text("{not json")  # a damaged cache file is trained anew
    with capture_logs() as logs:
        retrained = local_reference(config, cache_dir=tmp_path)
    assert _reference_events(logs)[:2] == ["reference.unreadable", "reference.training"]
    assert retrained.source == "trained"
    assert retrained.clients == first.clients


def test_clients_past_the_process_bound_queue_and_score_as_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reference of many clients forks a bounded number of trainers (200 at once once
    ran the machine out of memory); the clients that wait train in a reused process and
    score exactly as each does alone (the threads path, one build at a time)."""
    assert reference_processes(6) == 6  # the default job's clients all train at once
    assert 8 <= reference_processes(200) < 200
    config = load_config(CONFIG, [*FAST, "rounds=2", "federation.num_clients=5", "model.name=tiny"])
    shards = client_shards(config)
    pools: list[int] = []

    class Recorded(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **options: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **options)

    monkeypatch.setattr(reference_module, "ProcessPoolExecutor", Recorded)
    monkeypatch.setattr(reference_module, "reference_processes", lambda clients: 2)
    queued = train_local_reference(config, shards)
    alone = train_local_reference(config, shards, workers=5)
    assert pools == [2]
    assert set(queued) == {"0", "1", "2", "3", "4"}
    assert queued == alone


# Run in a fresh interpreter: each forked trainer reports what it found imported when it
# began.
INHERITED = """
import json, sys
from types import SimpleNamespace
from mqttfl.evaluation import reference

def probe(plan, cid, done, **options):
    return [{"client": cid, "inherited": sorted(m for m in ("torch", "torch._dynamo") if m in sys.modules)}]

reference._run_client = probe
plan = SimpleNamespace(ids=["0", "1"], config=SimpleNamespace(train=SimpleNamespace(torch_threads=1)))
before = "torch" in sys.modules
found = reference._train_in_processes(plan, None)
import gc
print(json.dumps({"before": before, "found": found, "frozen": gc.get_freeze_count()}))
"""


def test_the_trainers_inherit_torch_and_never_its_compiler() -> None:
    """The parent imports torch once before forking, so no trainer pays it again (and
    torch's compiler stack, which ``torch.optim`` would import, is in neither); it
    unfreezes what it froze for the children."""
    done = subprocess.run(
        [sys.executable, "-c", INHERITED], capture_output=True, text=True, check=True, timeout=120
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] is False  # nothing imported torch before the reference
    assert [row["inherited"] for row in report["found"]] == [["torch"]] * 2
    assert report["frozen"] == 0


def test_the_key_follows_the_data_not_the_method() -> None:
    config = load_config(CONFIG, TINY)
    shards = client_shards(config)
    key, keyed = reference_key(config, shards)
    assert "method" not in json.dumps(keyed["config"])
    assert reference_key(load_config(CONFIG, [*TINY, "method=local"]), shards)[0] == key
    labels = shards["1"].y_train.copy()
    labels[0] = (labels[0] + 1) % 21  # one label of one client
    relabelled = {**shards, "1": replace(shards["1"], y_train=labels)}
    assert reference_key(config, relabelled)[0] != key
    for item in ("rounds=3", "train.lr=0.02", "model.name=tiny", "federation.fraction=0.5"):
        assert reference_key(load_config(CONFIG, [*TINY, item]), shards)[0] != key, item


def _summary() -> dict[str, Any]:
    row = {"f1": 0.3, "mae": 1.5, "kb_sent": 10.0, "kb_received": 20.0}
    return {
        "method": "fedapa",
        "run_id": "r",
        "rounds_completed": 3,
        "clients": {"0": {"accuracy": 0.5, **row}, "1": {"accuracy": 0.25, **row}},
        "mean": {"accuracy": 0.375, "f1": 0.3, "mae": 1.5},
        "comm": {"up_bytes_per_client_round": 1000.0, "down_bytes_per_client_round": 2000.0},
    }


def _doc(summary: dict[str, Any]) -> RunSummary:
    return RunSummary.model_validate(summary)


def test_the_table_shows_local_and_gain_beside_each_accuracy() -> None:
    local = {
        "0": {"accuracy": 0.4, "f1": 0.2, "mae": 2.0},
        "1": {"accuracy": 0.3, "f1": 0.2, "mae": 2.0},
    }
    reference = LocalReference(local, "k" * 64, "cached", Path("/cache/k.json"), 12.0)
    summary = with_reference(_doc(_summary()), reference)
    assert summary.local_reference is not None
    assert summary.local_reference.gain.clients == pytest.approx({"0": 0.1, "1": -0.05})
    assert summary.local_reference.gain.mean == pytest.approx(0.025)
    lines = format_table(summary).splitlines()
    assert lines[1].split() == [
        "client",
        "accuracy",
        "local",
        "gain",
        "macro-F1",
        "MAE",
        "KB",
        "sent",
        "KB",
        "recv",
    ]
    assert lines[2].split()[:5] == ["0", "0.5000", "0.4000", "+0.1000", "0.3000"]
    assert lines[3].split()[:5] == ["1", "0.2500", "0.3000", "-0.0500", "0.3000"]
    assert lines[4].split() == ["mean", "0.3750", "0.3500", "+0.0250", "0.3000", "1.500"]
    assert "gain = accuracy - local" in lines[5]
    assert lines[6] == "local reference: reused from /cache/k.json"

    plain = format_table(_doc(_summary())).splitlines()
    assert "local" not in plain[1]
    assert "gain" not in plain[1]
    assert plain[2].split() == ["0", "0.5000", "0.3000", "1.500", "10.0", "20.0"]


def test_a_client_without_a_reference_shows_dashes() -> None:
    reference = LocalReference(
        {"0": {"accuracy": 0.4, "f1": 0.2, "mae": 2.0}}, "k" * 64, "trained", None, 3.0
    )
    lines = format_table(with_reference(_doc(_summary()), reference)).splitlines()
    assert lines[3].split()[:4] == ["1", "0.2500", "-", "-"]
    assert lines[4].split()[:4] == ["mean", "0.3750", "0.4000", "+0.1000"]
    assert lines[6] == "local reference: trained in 3 s, could not be cached"


def test_the_table_names_its_split_and_says_what_federation_bought() -> None:
    local = {
        "0": {"accuracy": 0.4, "f1": 0.2, "mae": 2.0},
        "1": {"accuracy": 0.3, "f1": 0.2, "mae": 2.0},
    }
    reference = LocalReference(local, "k" * 64, "cached", Path("/cache/k.json"), 12.0)
    summary = with_reference(_doc({**_summary(), "split": "session"}), reference)
    lines = format_table(summary).splitlines()
    assert "session split" in lines[0]
    assert lines[-1] == (
        "federation gained 2.5 points over training alone "
        "(fedapa 37.5 % vs Local 35.0 %, session split); 1 of 2 clients gained"
    )
    window = format_table(_doc({**_summary(), "split": "window"})).splitlines()
    assert "window split" in window[0]


def test_mae_is_shown_only_for_count_labels() -> None:
    activities = format_table(_doc({**_summary(), "ordinal_labels": False})).splitlines()
    assert "MAE" not in activities[1]
    assert activities[2].split() == ["0", "0.5000", "0.3000", "10.0", "20.0"]
    counts = format_table(_doc({**_summary(), "ordinal_labels": True})).splitlines()
    assert "MAE" in counts[1]
