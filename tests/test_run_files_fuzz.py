"""Nothing a command reads can destroy the user's data or end in
a traceback.

Before: ``mqttfl export`` of a client whose state file was cut short (or was a pickle)
exited 0 with an untrained "round 0" model and renamed the run's ``.pt`` to
``.discarded``, so the next export said "not found"; ``report`` on a ``summary.json`` of
``[]`` or a metrics round of ``1e400``, and ``export`` with a cut last line of
``metrics.jsonl``, ended in tracebacks. Now: one line naming the file and what is wrong
(exit 2), the run's files as they were, and a cut last line left out. Then hypothesis
feeds every file of a run directory (summary, metrics, checkpoints, a client's state)
arbitrary bytes, arbitrary JSON and mutations of the real thing: report, export and
resume give their documented error or a result, never anything else, and never change
a file.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.config import RunConfig, load_config
from mqttfl.data.sources import load_client_shard
from mqttfl.engine.documents import read_metrics_file
from mqttfl.engine.journal import Journal
from mqttfl.engine.state import check_resume
from mqttfl.errors import MqttflError
from mqttfl.evaluation.report import find_runs, method_rows, render_markdown
from mqttfl.export.client import last_scores, run_summary
from mqttfl.logs import get_logger
from mqttfl.nodes.client_state import Progress, StateFile
from mqttfl.nodes.device import build_client_side
from mqttfl.wire.codec import pack_data, unpack_data
from tests.helpers import mqttfl
from tests.run_files import (
    OVERRIDES,
    copy_run,
    finish_a_run,
    one_line_error,
    snapshot,
    state_file,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finish_a_run(tmp_path_factory.mktemp("fuzz") / "run")


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return load_config("configs/fedapa-csi.toml", OVERRIDES)


# --- the rows, through the real command line ------------------------------------------------
@pytest.mark.parametrize("damage", ["cut short", "a pickle"])
def test_export_of_a_state_it_cannot_read_is_one_line_and_keeps_the_file(
    finished: Path, tmp_path: Path, damage: str
) -> None:
    run = copy_run(finished, tmp_path / "run")
    path = state_file(run, "0")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] if damage == "cut short" else pickle.dumps(Path("x")))
    before = snapshot(run)
    for attempt in ("first", "second"):  # the second export finds the same file
        result = mqttfl("export", str(run), "--client", "0", "--out", str(tmp_path / attempt))
        line = one_line_error(result)
        assert f"{path}: unreadable" in line, line
        assert snapshot(run) == before  # not renamed, not changed
        assert not (tmp_path / attempt / "model.onnx").exists()  # no untrained export


def test_export_of_a_state_that_never_applied_a_round_is_one_line(
    finished: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path / "run")
    path = state_file(run, "0")
    state = torch.load(path, weights_only=True)
    torch.save({**state, "applied_round": 0}, path)
    line = one_line_error(mqttfl("export", str(run), "--client", "0", "--out", str(tmp_path / "x")))
    assert f"{path}: holds no trained round" in line, line


def test_export_reads_metrics_up_to_the_last_complete_line_and_changes_nothing(
    finished: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path / "run")
    metrics = run / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-30])  # a kill during the last write
    before = snapshot(run)
    result = mqttfl("export", str(run), "--client", "1", "--out", str(tmp_path / "export"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert snapshot(run) == before
    sensor = json.loads((tmp_path / "export" / "sensor.json").read_text())
    assert sensor["run"]["round"] >= 1
    complete, _ = read_metrics_file(metrics)
    assert sensor["scores"]["round"] == max(r.round for r in complete if r.client_id == "1")


@pytest.mark.parametrize(
    ("file", "content", "expected"),
    [
        ("summary.json", b"[]", "summary.json: holds a JSON list, not a run summary"),
        ("summary.json", b"[" * 100_000, "summary.json: is not valid JSON: nested too deeply"),
        ("summary.json", b'{"method": "fedapa"}', "summary.json: run_id: Field required"),
        ("metrics.jsonl", None, "metrics.jsonl: line 1: round must be an integer"),
    ],
)
def test_report_on_a_malformed_run_file_is_one_line(
    finished: Path, tmp_path: Path, file: str, content: bytes | None, expected: str
) -> None:
    run = copy_run(finished, tmp_path / "run")
    if content is None:  # a metrics round of 1e400 (JSON reads it as inf)
        lines = (run / file).read_text().splitlines()
        lines[0] = lines[0].replace('"round": ', '"round": 1e400, "was": ')
        content = ("\n".join(lines) + "\n").encode()
    (run / file).write_bytes(content)
    before = snapshot(run)
    line = one_line_error(mqttfl("report", str(run), "--out", str(tmp_path / "report")))
    assert expected in line, line
    assert snapshot(run) == before
    if file == "summary.json":
        export = mqttfl("export", str(run), "--client", "0", "--out", str(tmp_path / "export"))
        assert expected in one_line_error(export)


# --- property tests: every file of the run directory -------------------------------------------
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_json: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=12),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


def _mutated(data: st.DataObject, document: Any, values: st.SearchStrategy[Any] = _json) -> Any:
    """``document`` with one value somewhere inside it replaced or removed."""
    document = copy.deepcopy(document)
    node = document
    while isinstance(node, dict | list) and node:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, dict | list) and child and data.draw(st.booleans()):
            node = child
            continue
        if data.draw(st.booleans()):
            del node[key]
        else:
            node[key] = data.draw(values)
        break
    return document


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity included, as Python writes them


@contextlib.contextmanager
def a_copy(finished: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield copy_run(finished, Path(tmp) / "run")


def _reads(run: Path, config: RunConfig) -> None:
    """Everything report, export and resume read of ``run``: each gives its result or
    an MqttflError, and no file changes."""
    before = snapshot(run)
    for read in (
        lambda: render_markdown(runs := find_runs([run]), method_rows(runs)),
        lambda: run_summary(run),
        lambda: last_scores(run, "0"),
        lambda: check_resume(Journal(run), config),
    ):
        error = ""
        try:
            read()
        except MqttflError as exc:
            error = str(exc)
        assert "\n" not in error, error
    assert snapshot(run) == before


_summary_bytes = st.one_of(st.binary(max_size=64), _json.map(_dumps))


@FUZZ
@given(data=st.data())
def test_any_summary_json(finished: Path, config: RunConfig, data: st.DataObject) -> None:
    with a_copy(finished) as run:
        path = run / "summary.json"
        if data.draw(st.booleans()):
            path.write_bytes(data.draw(_summary_bytes))
        else:
            path.write_bytes(_dumps(_mutated(data, json.loads(path.read_text()))))
        _reads(run, config)


@FUZZ
@given(data=st.data())
def test_any_metrics_jsonl(finished: Path, config: RunConfig, data: st.DataObject) -> None:
    with a_copy(finished) as run:
        path = run / "metrics.jsonl"
        raw = path.read_bytes()
        how = data.draw(st.sampled_from(["bytes", "json lines", "one record", "cut"]))
        if how == "bytes":
            path.write_bytes(data.draw(st.binary(max_size=200)))
        elif how == "json lines":
            lines = data.draw(st.lists(_json.map(_dumps), max_size=4))
            path.write_bytes(b"\n".join(lines) + data.draw(st.sampled_from([b"", b"\n"])))
        elif how == "one record":
            records = [json.loads(line) for line in raw.splitlines()]
            index = data.draw(st.integers(0, len(records) - 1))
            records[index] = _mutated(data, records[index])
            path.write_bytes(b"".join(_dumps(r) + b"\n" for r in records))
        else:
            cut = data.draw(st.integers(0, len(raw)))
            path.write_bytes(raw[:cut])
            read, _ = read_metrics_file(path)  # the complete lines (and a whole last one)
            records = [line.model_dump(exclude_unset=True) for line in read]
            complete, originals = raw[:cut].count(b"\n"), [json.loads(x) for x in raw.splitlines()]
            assert records[:complete] == originals[:complete]
            assert records[complete:] in ([], originals[complete : complete + 1])
        _reads(run, config)


_msgpack_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=12),
        st.binary(max_size=16),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(data=st.data())
def test_any_checkpoint(finished: Path, config: RunConfig, data: st.DataObject) -> None:
    with a_copy(finished) as run:
        journal = Journal(run)
        paths = [journal.checkpoint_path, journal.previous_checkpoint_path]
        for path in data.draw(st.sampled_from([paths[:1], paths[1:], paths])):
            how = data.draw(st.sampled_from(["bytes", "tree", "one field", "cut", "gone"]))
            raw = path.read_bytes()
            if how == "bytes":
                path.write_bytes(data.draw(st.binary(max_size=200)))
            elif how == "tree":
                path.write_bytes(pack_data(data.draw(_msgpack_values)))
            elif how == "one field":
                path.write_bytes(pack_data(_mutated(data, unpack_data(raw), _msgpack_values)))
            elif how == "cut":
                path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
            else:
                path.unlink()
        _reads(run, config)
        try:
            resume = check_resume(journal, config)
        except MqttflError:
            return
        before = snapshot(run)
        resume.apply(get_logger())  # what it sets aside, it keeps
        after = snapshot(run)
        assert sorted(before.values()) == sorted(after.values())


@pytest.fixture(scope="module")
def client_side(config: RunConfig) -> Any:
    algorithm = get_algorithm(config.method)
    shard = load_client_shard(
        config.data,
        "0",
        seed=config.seed,
        num_classes=config.model.num_classes,
        num_clients=config.federation.num_clients,
    )
    return build_client_side(config, algorithm, make_context(config), "0", shard)


_tensors = st.builds(
    lambda shape, value: torch.full(shape, value),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)
_state_values = st.one_of(
    _json, _tensors, st.dictionaries(st.text(max_size=8), _tensors, max_size=3)
)


@FUZZ
@given(data=st.data())
def test_any_client_state(finished: Path, client_side: Any, data: st.DataObject) -> None:
    with a_copy(finished) as run:
        path = state_file(run, "0")
        how = data.draw(st.sampled_from(["bytes", "cut", "one entry", "any value"]))
        raw = path.read_bytes()
        if how == "bytes":
            path.write_bytes(data.draw(st.binary(max_size=200)))
        elif how == "cut":
            path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
        elif how == "one entry":
            state = torch.load(path, weights_only=True)
            torch.save(_mutated(data, state, _state_values), path)
        else:
            torch.save(data.draw(_state_values), path)
        before = snapshot(run)
        error = f"{path}: "
        try:
            StateFile(path).load_read_only(client_side.model, client_side, Progress())
        except MqttflError as exc:
            error = str(exc)
        assert error.startswith(f"{path}: "), error
        assert "\n" not in error, error
        assert snapshot(run) == before
        assert not list(run.rglob("*.discarded"))
