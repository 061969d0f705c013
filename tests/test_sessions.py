"""The session split: test windows from sessions a client never trained on, per source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mqttfl.commands.main import main
from mqttfl.config import load_config
from mqttfl.data.espectre import ESPECTRE_CHIPS, espectre_shard
from mqttfl.data.labels import parse_classes
from mqttfl.data.sessions import held_out_sessions, split_by_session
from mqttfl.data.shard import load_shard, save_shard
from mqttfl.data.shard_builder import build_shards
from mqttfl.data.sources import load_client_shard
from mqttfl.data.synthetic import SESSIONS_PER_COUNT, make_room_shard
from mqttfl.errors import ConfigError, DataError
from tests._shared_data import require_shared


def _disjoint(shard_s_train: np.ndarray | None, shard_s_test: np.ndarray | None) -> bool:
    assert shard_s_train is not None
    assert shard_s_test is not None
    return not set(shard_s_train.tolist()) & set(shard_s_test.tolist())


# ----------------------------------------------------------------------------- the rule


def test_held_out_sessions_on_a_hand_made_case() -> None:
    # label 0 in sessions 0, 1, 2; label 1 in sessions 1, 2; label 2 in session 3 only
    sessions = np.array([0, 0, 1, 2, 1, 2, 3, 3])
    y = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    # label 0: round(0.2 * 3) = 1 -> session 2 (the latest); label 1 already has it
    assert held_out_sessions(sessions, y, 0.2) == [2]
    # label 0: round(0.5 * 3) = 2 -> sessions 2, 1; label 1 would keep no training session
    # at a share of 1.0, so at most n - 1 = 1 of its 2 sessions is asked for
    assert held_out_sessions(sessions, y, 0.5) == [1, 2]
    train, test, held = split_by_session(sessions, y, 0.2)
    assert held == [2]
    assert test.tolist() == [3, 5]
    assert train.tolist() == [0, 1, 2, 4, 6, 7]  # label 2 (one session) only trains


def test_a_label_in_one_session_is_never_tested() -> None:
    sessions = np.array([0, 0, 0])
    y = np.array([4, 4, 4])
    assert held_out_sessions(sessions, y, 0.5) == []


# ----------------------------------------------------------------------------- sources


def test_synthetic_session_split_holds_out_whole_days() -> None:
    window = make_room_shard(1, seed=3, window=8, samples=120, split="window")
    session = make_room_shard(1, seed=3, window=8, samples=120, split="session")
    assert window.has_sessions
    assert session.has_sessions
    assert not _disjoint(window.s_train, window.s_test)  # the papers' split shares sessions
    assert _disjoint(session.s_train, session.s_test)
    assert session.meta["split"]["method"] == "session"
    assert session.meta["split"]["test_sessions"] == [f"day-{SESSIONS_PER_COUNT - 1}"]
    assert session.meta["ordinal"] is True
    # the same windows, split two ways
    assert window.num_train + window.num_test == session.num_train + session.num_test


def test_espectre_session_split_holds_out_whole_recordings() -> None:
    root = require_shared("espectre")
    for client in range(len(ESPECTRE_CHIPS)):
        shard = espectre_shard(client, root=root, window=64, split="session")
        assert _disjoint(shard.s_train, shard.s_test), ESPECTRE_CHIPS[client]
        assert set(np.unique(shard.y_test).tolist()) == {0, 1}
        assert shard.meta["ordinal"] is False
        tested = shard.meta["split"]["test_sessions"]
        assert tested
        assert not set(tested) & set(shard.meta["split"]["train_sessions"])


def test_prepared_session_split_by_regex_and_inspect_shows_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = require_shared("csi-samples", "intel5300-activity")
    files = sorted(root.glob("may/*.dat")) + sorted(root.glob("august/*.dat"))
    out = tmp_path / "shard"
    code = main(
        [
            "data",
            "prepare",
            "--format",
            "intel5300",
            "--input",
            *map(str, files),
            "--label",
            "filename",
            "--out",
            str(out),
            "--window",
            "100",
            "--split",
            "session",
            "--session",
            "regex:/(may|august)/",
        ]
    )
    assert code == 0
    shard = load_shard(out)
    assert shard.session_names == ["may", "august"]
    assert _disjoint(shard.s_train, shard.s_test)
    assert shard.meta["split"]["test_sessions"] == ["august"]
    assert shard.meta["ordinal"] is False
    capsys.readouterr()
    assert main(["data", "inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "split: session" in shown
    assert "brushteeth: 1 (may)" in shown
    assert "brushteeth: 1 (august)" in shown
    assert main(["data", "inspect", "--json", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sessions_per_label"]["test"] == {
        "brushteeth": ["august"],
        "washingdishes": ["august"],
    }


def test_a_session_split_of_one_session_names_the_sessions() -> None:
    root = require_shared("csi-samples", "intel5300-activity")
    files = sorted(root.glob("may/*.dat"))
    with pytest.raises(DataError, match="the sessions are may"):
        build_shards(
            "intel5300",
            files,
            labels="filename",
            window=100,
            split="session",
            session="regex:/(may|august)/",
        )


def test_session_ids_survive_a_round_trip_and_bad_ones_are_rejected(tmp_path: Path) -> None:
    shard = make_room_shard(0, seed=1, window=4, samples=60, split="session")
    save_shard(shard, tmp_path / "s")
    back = load_shard(tmp_path / "s")
    assert back.s_train is not None
    assert shard.s_train is not None
    assert np.array_equal(back.s_train, shard.s_train)
    with np.load(tmp_path / "s" / "shard.npz") as npz:
        arrays = dict(npz)
    arrays["s_test"] = arrays["s_test"] + 10  # no such session
    np.savez(tmp_path / "s" / "shard.npz", **arrays)
    with pytest.raises(DataError, match="outside meta") as info:
        load_shard(tmp_path / "s")
    assert "shard.npz" in str(info.value)


def test_the_config_split_reaches_the_source_and_is_checked(tmp_path: Path) -> None:
    config = load_config(None, ["data.split=session", "data.samples_per_client=60"])
    shard = load_client_shard(config.data, "2", seed=0, num_classes=21, num_clients=6)
    assert shard.meta["split"]["method"] == "session"
    with pytest.raises(ConfigError, match=r"data\.split"):
        load_config(None, ["data.split=days"])
    digits = load_config(None, ["data.split=session", "data.source=digits"])
    with pytest.raises(ConfigError, match=r"data\.split"):
        load_client_shard(digits.data, "0", seed=0, num_classes=10, num_clients=2)
    # a prepared shard keeps the split it was prepared with: a mismatch is an error
    save_shard(make_room_shard(0, seed=0, window=4, samples=40), tmp_path / "client-0")
    shards = load_config(
        None, ["data.source=shards", f"data.path={tmp_path}", "data.split=session"]
    )
    with pytest.raises(DataError, match=r"window split, but data\.split is 'session'"):
        load_client_shard(shards.data, "0", seed=0, num_classes=21, num_clients=1)


def test_session_validation_holds_out_training_sessions_only() -> None:
    config = load_config(
        None,
        ["data.split=session", "data.samples_per_client=90", "data.validation_fraction=0.3"],
    )
    shard = load_client_shard(config.data, "0", seed=0, num_classes=21, num_clients=6)
    test_day = f"day-{SESSIONS_PER_COUNT - 1}"
    assert test_day not in shard.meta["validation_sessions"]
    assert _disjoint(shard.s_train, shard.s_test)
    names = shard.session_names
    assert shard.s_train is not None
    assert test_day not in {names[s] for s in shard.s_train.tolist()}


# ----------------------------------------------------------------------------- --classes


def test_classes_take_ranges_and_lists() -> None:
    assert parse_classes("0..3") == ["0", "1", "2", "3"]
    assert parse_classes("0-3") == ["0", "1", "2", "3"]
    assert parse_classes("0..2,7") == ["0", "1", "2", "7"]
    assert parse_classes("walk, cook") == ["walk", "cook"]
    with pytest.raises(ValueError, match="empty class range"):
        parse_classes("5..2")
    with pytest.raises(ValueError, match="repeat: 2"):
        parse_classes("0..2,2")


def test_a_label_error_says_what_the_classes_were_parsed_as(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "crowd_12.csv"
    capture.write_text("\n".join(",".join(["1"] * 4) for _ in range(40)) + "\n")
    args = ["data", "prepare", "--format", "csv", "--input", str(capture), "--window", "4"]
    code = main([*args, "--label", "12", "--classes", "0..10", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert "label '12' is not one of the classes" in err
    assert "0..10 (11 classes)" in err
    code = main([*args, "--label", "7", "--classes", "0..10", "--out", str(tmp_path / "o")])
    assert code == 0
    shard = load_shard(tmp_path / "o")
    assert shard.meta["ordinal"] is True
    assert set(shard.y_train.tolist()) == {7}


# ----------------------------------------------------------------------------- compare


def test_compare_tables_name_the_split_and_drop_mae_for_categories() -> None:
    from mqttfl.evaluation.compare_entries import RunResult
    from mqttfl.evaluation.compare_report import aggregate, markdown_table

    results = []
    for seed, accuracy in ((0, 0.5), (1, 0.7)):
        run = RunResult("data", "fedavg", seed, Path(f"/x/{seed}"))
        run.metrics = {"accuracy": accuracy, "f1": 0.4, "mae": 1.25, "kb": 10.0}
        results.append(run)
    rows = aggregate(results, ["fedavg"], ["data"])
    counts = markdown_table(rows, ["fedavg"], ["data"], [0, 1], split="session")
    assert counts.startswith("Session split (test sessions the client never trained on).")
    assert "MAE" in counts
    assert "1.250 ± 0.000" in counts
    categories = markdown_table(rows, ["fedavg"], ["data"], [0, 1], ordinal=False)
    assert categories.startswith("Window split")
    assert "MAE" not in categories
    assert "1.250" not in categories
    assert "| fedavg | 60.00 ± 14.14 | 40.00 ± 0.00 | 10.0 ± 0.0 |" in categories
