"""The typed run documents (mqttfl/engine/documents.py): each round-trips, a file from
before versions were recorded is read as version 1, a newer version is refused in one
line naming the file and the version, and a journal cut short reads up to its last line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqttfl.config import load_config
from mqttfl.engine.documents import (
    CHECKPOINT_VERSION,
    SUMMARY_VERSION,
    CompareDocument,
    CompareRow,
    MetricsLine,
    checkpoint_from_map,
    compare_bytes,
    read_compare,
    read_metrics_file,
    read_summary,
    summary_bytes,
)
from mqttfl.engine.journal import Journal
from mqttfl.engine.state import RunState, run_summary
from mqttfl.errors import DataError, FileError, StateError
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import Metrics
from mqttfl.wire.downlinks import DownlinkPayloads

CONFIG = load_config("configs/fedapa-csi.toml", ["rounds=3", "federation.num_clients=2"])


def _line(client: str, t: int, accuracy: float) -> MetricsLine:
    values = {"accuracy": accuracy, "f1": accuracy / 2, "mae": 1.0, "num_test": 20}
    return MetricsLine.of(Metrics(t, client, {**values, "bytes_up": 1500, "bytes_down": 500}))


def _records() -> list[MetricsLine]:
    return [_line(c, t, 0.1 * t + (c == "1") * 0.05) for t in (1, 2, 3) for c in ("0", "1")]


def _state() -> RunState:
    return RunState(
        round=3,
        server={"weights": [1.0, 2.0]},
        comm={"up_bytes": 9000, "up_count": 6, "down_bytes": 3000, "down_count": 6},
        retries=1,
        rejections=Counter({"stale": 2}),
        downlinks=DownlinkPayloads(b"broadcast", {"0": b"mine"}),
        clients=["1", "0"],
        uploads=Counter({"0": 3, "1": 3}),
        last_uploaders=["0", "1"],
    )


def _written_summary() -> dict[str, Any]:
    loaded = json.loads(summary_bytes(run_summary(CONFIG, _state(), _records())))
    assert isinstance(loaded, dict)
    return loaded


# --- summary.json ----------------------------------------------------------------------------
def test_the_summary_round_trips_through_its_file(tmp_path: Path) -> None:
    summary = run_summary(CONFIG, _state(), _records())
    Journal(tmp_path).write_summary(summary)
    read = read_summary(tmp_path / "summary.json")
    assert read == summary
    assert summary_bytes(read) == (tmp_path / "summary.json").read_bytes()
    assert read.version == SUMMARY_VERSION
    assert read.clients["1"].accuracy == pytest.approx((0.25 + 0.35 + 0.15) / 3)
    assert read.clients["0"].kb_sent == pytest.approx(4.5)
    assert read.mean.accuracy == pytest.approx((0.2 + 0.25) / 2)
    assert read.comm.up_bytes_per_client_round == 1500.0
    assert read.rejections == {"stale": 2}


def test_the_summary_file_keeps_the_keys_it_had_plus_its_version() -> None:
    written = _written_summary()
    assert written["version"] == SUMMARY_VERSION
    assert set(written) == {
        "version",
        "run_id",
        "method",
        "split",
        "ordinal_labels",
        "rounds_completed",
        "clients",
        "mean",
        "comm",
        "rejections",
        "rejected_messages",
        "retries",
        "missing_uploads",
        "config",
    }
    assert set(written["clients"]["0"]) == {
        "accuracy",
        "f1",
        "mae",
        "kb_sent",
        "kb_received",
        "rounds_reported",
        "last_rounds",  # the rounds its means cover
    }
    assert set(written["comm"]) == {
        "up_bytes_per_client_round",
        "down_bytes_per_client_round",
        "up_bytes_total",
        "down_bytes_total",
    }


def test_a_summary_from_before_versions_is_read_and_rewritten_as_it_was(tmp_path: Path) -> None:
    older = _written_summary()
    for key in ("version", "split", "ordinal_labels", "config"):
        del older[key]
    older["from_an_older_mqttfl"] = {"kept": True}  # a key this version does not know
    del older["clients"]["0"]["rounds_reported"]
    (tmp_path / "summary.json").write_text(json.dumps(older))
    read = read_summary(tmp_path / "summary.json")
    assert read.version == 1
    assert (read.data_split, read.shows_mae) == ("window", True)  # as such summaries showed
    assert json.loads(summary_bytes(read)) == {**older, "version": 1}


def test_a_summary_of_a_newer_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**_written_summary(), "version": 2}))
    with pytest.raises(DataError) as raised:
        read_summary(path)
    assert str(raised.value).startswith(f"{path}: is a run summary of version 2;")
    assert "reads version 1" in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: {**d, "mean": {**d["mean"], "accuracy": 1.5}}, "mean.accuracy:"),
        (lambda d: {k: v for k, v in d.items() if k != "comm"}, "comm: Field required"),
        (lambda d: {**d, "version": "1"}, "version '1'"),
    ],
)
def test_a_malformed_summary_is_one_data_error(tmp_path: Path, change: Any, expected: str) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(change(_written_summary())))
    with pytest.raises(DataError, match=expected):
        read_summary(path)


def test_a_cut_summary_is_one_data_error(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_bytes(summary_bytes(run_summary(CONFIG, _state(), _records()))[:-40])
    with pytest.raises(DataError, match="is not valid JSON"):
        read_summary(path)


# --- metrics.jsonl ---------------------------------------------------------------------------
def test_metrics_lines_round_trip_and_keep_what_the_client_reported(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    extra = MetricsLine.of(Metrics(4, "0", {"accuracy": 1, "f1": 0.5, "mae": 0, "loss": 0.25}))
    for line in [*_records(), extra]:
        journal.append_metrics(line)
    read, _ = journal.read_metrics()
    assert read == [*_records(), extra]
    assert read[-1].value("loss") == 0.25
    assert read[-1].value("bytes_up") == 0.0  # not reported: none
    assert read[-1].value("nothing") is None
    last = journal.metrics_path.read_text().splitlines()[-1]
    assert json.loads(last) == {
        "version": 1,
        "round": 4,
        "client_id": "0",
        "accuracy": 1,
        "f1": 0.5,
        "mae": 0,
        "loss": 0.25,
    }
    assert '"accuracy": 1,' in last  # as the client sent it: an int stays an int
    assert '"mae": 0,' in last


def test_metrics_lines_from_before_versions_are_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    older = [{k: v for k, v in line.model_dump().items() if k != "version"} for line in _records()]
    path.write_text("".join(json.dumps(r) + "\n" for r in older))
    read, _ = read_metrics_file(path)
    assert [r.version for r in read] == [1] * len(older)
    assert [(r.round, r.client_id) for r in read] == [(r["round"], r["client_id"]) for r in older]


def test_a_metrics_line_of_a_newer_version_is_refused_naming_file_and_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [line.model_dump() for line in _records()]
    lines[2]["version"] = 7
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(DataError) as raised:
        read_metrics_file(path)
    assert str(raised.value).startswith(f"{path}: line 3: is a metrics line of version 7;")


def test_a_metrics_journal_cut_mid_line_reads_up_to_its_last_complete_line(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path)
    for line in _records():
        journal.append_metrics(line)
    raw = journal.metrics_path.read_bytes()
    journal.metrics_path.write_bytes(raw[:-25])  # a coordinator killed mid-write
    read, lines = journal.read_metrics()
    assert read == _records()[:-1]
    assert lines.tail
    assert not lines.whole_tail
    assert journal.metrics_path.read_bytes() == raw[:-25]  # reading changes nothing


# --- checkpoint.msgpack ----------------------------------------------------------------------
def test_the_checkpoint_round_trips_through_its_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    state = _state()
    journal.save_checkpoint(state.to_dict(CONFIG))
    saved = unpack_data(journal.checkpoint_path.read_bytes())
    assert saved["version"] == CHECKPOINT_VERSION
    again = RunState.from_dict(saved, CONFIG, source="checkpoint")
    assert again.to_dict(CONFIG) == state.to_dict(CONFIG)
    assert again.downlinks == state.downlinks
    assert again.clients == ["0", "1"]
    assert again.last_uploaders == ["0", "1"]


def test_a_checkpoint_being_replaced_is_always_readable_under_its_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed while the next checkpoint is written (buffered mode writes one per
    upload) leaves checkpoint.msgpack in place, the previous one beside it."""
    import mqttfl.engine.journal as journal_module
    from mqttfl import files

    journal = Journal(tmp_path)
    first, second = _state().to_dict(CONFIG), {**_state().to_dict(CONFIG), "round": 4}
    journal.save_checkpoint(first)
    seen: list[Any] = []

    def observed(path: Path, data: bytes, **kwargs: Any) -> None:
        if path == journal.checkpoint_path:  # the instant before the new one lands
            seen.append(unpack_data(path.read_bytes()) if path.exists() else None)
            seen.append(unpack_data(journal.previous_checkpoint_path.read_bytes()))
        files.write_atomic(path, data, **kwargs)

    monkeypatch.setattr(journal_module, "write_atomic", observed)
    journal.save_checkpoint(second)
    assert seen == [first, first]
    assert unpack_data(journal.checkpoint_path.read_bytes()) == second
    assert unpack_data(journal.previous_checkpoint_path.read_bytes()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.msgpack",
        "checkpoint.prev.msgpack",
    ]


def test_a_checkpoint_set_aside_never_follows_a_link(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.save_checkpoint(_state().to_dict(CONFIG))
    target = tmp_path / "elsewhere"
    target.write_bytes(b"the user's file")
    journal.previous_checkpoint_path.symlink_to(target)
    with pytest.raises(FileError, match=r"checkpoint\.prev\.msgpack"):
        journal.save_checkpoint(_state().to_dict(CONFIG))
    assert target.read_bytes() == b"the user's file"


def test_a_checkpoint_from_before_versions_is_read() -> None:
    older = _state().to_dict(CONFIG)
    del older["version"]
    older["downlink_payloads"] = {}  # nothing saved, as some older ones said it
    state = RunState.from_dict(unpack_data(pack_data(older)), CONFIG, source="checkpoint")
    assert state.round == 3
    assert state.downlinks is None


def test_a_checkpoint_of_a_newer_version_or_another_run_is_refused() -> None:
    saved = _state().to_dict(CONFIG)
    with pytest.raises(DataError, match=r"^ckpt: is a checkpoint of version 2;"):
        checkpoint_from_map(
            {**saved, "version": 2}, "ckpt", run_id=CONFIG.run_id, method=CONFIG.method
        )
    with pytest.raises(StateError, match="belongs to run 'other'"):
        checkpoint_from_map({**saved, "run_id": "other"}, "ckpt", run_id=CONFIG.run_id, method="x")
    with pytest.raises(DataError, match="'retries' is not a count"):
        RunState.from_dict({**saved, "retries": True}, CONFIG, source="ckpt")
    with pytest.raises(DataError, match="'last_uploaders' is not a list of client ids"):
        RunState.from_dict({**saved, "last_uploaders": ["a/b"]}, CONFIG, source="ckpt")


# --- compare.json ----------------------------------------------------------------------------
def test_compare_rows_round_trip_keeping_the_keys_they_had(tmp_path: Path) -> None:
    pooled = CompareRow(method="pooled", setting="data", runs=0, seeds=[], absent="why")
    ran = CompareRow.model_validate(
        {
            "method": "fedavg",
            "setting": "data",
            "runs": 2,
            "model": None,
            "seeds": [0, 1],
            "failed_seeds": [],
            "absent": None,
            **{k: {"mean": 0.5, "std": 0.1} for k in ("accuracy", "f1", "mae", "kb")},
        }
    )
    document = CompareDocument(
        config="c.toml",
        overrides=[],
        seeds=[0, 1],
        split="window",
        ordinal_labels=True,
        settings={"data": {"title": "Statistical Data", "overrides": []}},
        required_model={},
        rows=[ran],
        pooled=[pooled],
        pooled_runs=[],
        runs=[],
    )
    path = tmp_path / "compare.json"
    path.write_bytes(compare_bytes(document))
    written = json.loads(path.read_text())
    assert written["version"] == 1
    assert list(written["pooled"][0]) == ["method", "setting", "runs", "seeds", "absent"]
    assert "accuracy" not in written["pooled"][0]
    assert written["rows"][0]["accuracy"] == {"mean": 0.5, "std": 0.1}
    read = read_compare(path)
    assert read.rows == [ran]
    assert read.pooled == [pooled]
    assert read.rows[0].metric("kb") is not None
    assert pooled.metric("accuracy") is None
    path.write_text(json.dumps({**written, "version": 3}))
    with pytest.raises(DataError, match="is a compare result of version 3"):
        read_compare(path)
