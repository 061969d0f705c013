"""What a killed coordinator leaves in its run dir never stops a resume.

Before: a ``metrics.jsonl`` ending in a partial line (a kill during a write) made the
restarted coordinator die with a JSONDecodeError traceback; a ``checkpoint.msgpack`` cut
short gave an "Unpack failed" traceback. Now the partial line is set aside and the run
resumes, a checkpoint that does not decode falls back to the previous one, and when none
decodes the coordinator says so in one line, naming ``--clear-run`` (which starts afresh
and sets the run dir aside), before it touches the broker.
(The live drill, ten ``kill -9`` at random points, is tests/test_crash_kill9.py.)
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from structlog.testing import capture_logs
from structlog.typing import FilteringBoundLogger as BoundLogger

from mqttfl.config import load_config
from mqttfl.engine.journal import Journal
from mqttfl.engine.state import check_resume
from mqttfl.errors import DataError, MqttflError
from mqttfl.files import append_line, read_json_lines, set_aside_tail, write_atomic
from mqttfl.logs import get_logger
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import RunStatus
from tests.faults import RUN_ID, Witness, read_events, wait_for
from tests.helpers import mqttfl
from tests.run_files import (
    OVERRIDES,
    ROUNDS,
    copy_run,
    finish_a_run,
    one_line_error,
    settings,
    snapshot,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finish_a_run(tmp_path_factory.mktemp("leftovers") / "run")


def coordinator(out: Path, broker_url: str, *extra: str) -> list[str]:
    return [
        "coordinator",
        "--config",
        "configs/fedapa-csi.toml",
        "--broker",
        broker_url,
        "--out",
        str(out),
        *settings("federation.final_metrics_timeout_s=1"),
        *extra,
    ]


def cut(path: Path) -> bytes:
    """Cut a file in half (what a write interrupted by a power cut may leave)."""
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return raw[: len(raw) // 2]


def test_a_partial_last_metrics_line_is_set_aside_and_the_run_resumes(
    finished: Path, broker: LocalBroker, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    (out / "summary.json").unlink()  # killed before the end: it resumes after round 3
    metrics = out / "metrics.jsonl"
    whole = metrics.read_bytes()
    tail = whole.splitlines(keepends=True)[-1][:57]  # a kill in the middle of a line
    metrics.write_bytes(whole + tail)

    result = mqttfl(*coordinator(out, broker.url), timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert metrics.read_bytes() == whole  # ends at its last complete line again
    (aside,) = out.glob("metrics.jsonl.partial-*")
    assert aside.read_bytes() == tail  # nothing destroyed
    (event,) = [
        e
        for e in read_events(out / "logs" / "coordinator.jsonl")
        if e["event"] == "journal.tail_set_aside"
    ]
    assert event["kept_as"] == aside.name
    assert event["bytes"] == len(tail)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == ROUNDS


def _retained(broker: LocalBroker, topic: str) -> list[bytes]:
    """The retained payloads on ``topic`` (fails if there are none within 10 s)."""
    with Witness(broker.port, [topic]) as witness:
        found = wait_for(
            lambda: witness.seen(lambda m: m.retain), timeout=10, what=f"a retained {topic}"
        )
        return [m.payload for m in found]


def test_no_checkpoint_that_decodes_is_one_line_and_the_broker_is_untouched(
    finished: Path, broker: LocalBroker, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    (out / "summary.json").unlink()
    cut(out / "checkpoint.msgpack")
    cut(out / "checkpoint.prev.msgpack")
    before = snapshot(out)
    # What a crashed run leaves on the broker: its retained state.
    state_topic = Topics(RUN_ID).state
    retained = RunStatus("closed", ROUNDS).encode(RUN_ID)
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="leftover-state")
    publisher.connect("127.0.0.1", broker.port)
    publisher.loop_start()
    publisher.publish(state_topic, retained, qos=1, retain=True).wait_for_publish(timeout=10)
    publisher.loop_stop()
    publisher.disconnect()

    result = mqttfl(*coordinator(out, broker.url), timeout=300)

    line = one_line_error(result)
    assert f"{out / 'checkpoint.msgpack'}: does not decode" in line, line
    assert f"{out / 'checkpoint.prev.msgpack'}: does not decode" in line, line
    assert "start the run afresh with --clear-run" in line, line
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith("logs/")} == before
    assert _retained(broker, state_topic) == [retained]  # checked before anything cleared


def test_a_checkpoint_that_does_not_decode_falls_back_to_the_previous_one(
    finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    config = load_config("configs/fedapa-csi.toml", OVERRIDES)
    journal = Journal(out)
    previous = journal.previous_checkpoint_path.read_bytes()
    assert unpack_data(previous)["round"] == ROUNDS - 1  # kept by the last save
    left = cut(journal.checkpoint_path)
    before = snapshot(out)

    resume = check_resume(journal, config)

    assert resume.state is not None
    assert resume.state.round == ROUNDS - 1
    assert snapshot(out) == before  # reading changes nothing
    with capture_logs() as logs:
        resume.apply(_logger())
    (event,) = [e for e in logs if e["event"] == "checkpoint.fell_back"]
    assert "does not decode" in event["reason"]
    assert event["from_round"] == ROUNDS - 1
    (bad,) = out.glob("checkpoint.msgpack.bad-*")
    assert bad.read_bytes() == left
    assert event["kept_as"] == bad.name
    assert not journal.checkpoint_path.exists()
    # The next checkpoint leaves the good previous one in place, not the bad one.
    journal.save_checkpoint(resume.state.to_dict(config))
    assert journal.previous_checkpoint_path.read_bytes() == previous
    assert check_resume(journal, config).state is not None


def test_killed_between_keeping_the_previous_checkpoint_and_writing_the_next(
    finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    config = load_config("configs/fedapa-csi.toml", OVERRIDES)
    journal = Journal(out)
    journal.checkpoint_path.replace(journal.previous_checkpoint_path)
    resume = check_resume(journal, config)
    assert resume.state is not None
    assert resume.state.round == ROUNDS
    with capture_logs() as logs:
        resume.apply(_logger())
    assert [e["reason"] for e in logs if e["event"] == "checkpoint.fell_back"] == ["missing"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: {**d, "run_id": "other"}, "belongs to run 'other'"),
        (lambda d: {**d, "round": -1}, "'round' is -1"),
        (lambda d: {**d, "comm": {"up_bytes": "many"}}, "'comm' is not a map of counts"),
        (lambda d: [d], "holds a list"),
    ],
)
def test_a_checkpoint_of_another_run_or_shape_is_one_error(
    finished: Path, tmp_path: Path, change: object, expected: str
) -> None:
    out = copy_run(finished, tmp_path / "run")
    config = load_config("configs/fedapa-csi.toml", OVERRIDES)
    journal = Journal(out)
    for path in (journal.checkpoint_path, journal.previous_checkpoint_path):
        path.write_bytes(pack_data(change(unpack_data(path.read_bytes()))))  # type: ignore[operator]
    before = snapshot(out)
    with pytest.raises(MqttflError) as raised:
        check_resume(journal, config)
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)
    assert snapshot(out) == before


def test_a_malformed_metrics_line_is_one_error_naming_its_line(
    finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[1] = lines[1].replace('"round": ', '"round": 1e400, "was": ')
    metrics.write_text("\n".join(lines) + "\n")
    config = load_config("configs/fedapa-csi.toml", OVERRIDES)
    with pytest.raises(DataError, match=r"metrics.jsonl: line 2: round must be an integer"):
        check_resume(Journal(out), config)


def _logger() -> BoundLogger:
    return get_logger(run_id=RUN_ID, client_id="coordinator")


def test_whole_files_are_replaced_in_one_step_and_journals_end_on_a_line(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_atomic(path, b"{}\n")
    write_atomic(path, b'{"a": 1}\n')
    assert path.read_bytes() == b'{"a": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # as open() would make it

    journal = tmp_path / "metrics.jsonl"
    append_line(journal, '{"a": 1}')
    journal.write_bytes(journal.read_bytes() + b'{"b": 2}')  # whole, but for its newline
    read = read_json_lines(journal)
    assert read.values == [{"a": 1}, {"b": 2}]
    assert set_aside_tail(read) is None  # completed, nothing to set aside
    append_line(journal, '{"c": 3}')
    assert journal.read_bytes() == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n'
