"""`mqttfl logs`: the JSON-lines logs of a run's processes, read from real files and
merged in time order; filters, lines a crash cut, a terminal, and --follow on a file
another process writes to while it runs."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mqttfl.commands.main import main
from tests.helpers import REPO, mqttfl

RUN = "fedapa-csi"


def _line(at: str, event: str, level: str = "info", **fields: Any) -> str:
    return json.dumps({"run_id": RUN, **fields, "event": event, "level": level, "timestamp": at})


def _write(path: Path, *lines: str, end: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + end)
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory as `mqttfl run` leaves it: one log per process in logs/, each in
    its own order, interleaved in time (a timestamp on the whole second, as structlog
    writes it, has no fraction)."""
    run = tmp_path / "run"
    logs = run / "logs"
    _write(
        logs / "coordinator.jsonl",
        _line("2026-01-02T10:00:00.100000Z", "round.started", client_id="coordinator", round=1),
        _line("2026-01-02T10:00:02.000000Z", "round.closed", client_id="coordinator", round=1),
        _line("2026-01-02T10:00:02.500000Z", "round.started", client_id="coordinator", round=2),
        _line(
            "2026-01-02T10:00:03.200000Z",
            "upload.accepted",
            "debug",
            client_id="coordinator",
            round=2,
            client="1",
        ),
        _line(
            "2026-01-02T10:00:04.000000Z",
            "upload.rejected",
            "warning",
            client_id="coordinator",
            round=2,
            client="0",
            reason="too large",
        ),
        _line("2026-01-02T10:00:05.000000Z", "round.closed", client_id="coordinator", round=2),
    )
    for client, offset in (("0", "0.3"), ("1", "0.6")):
        _write(
            logs / f"client-{client}.jsonl",
            json.dumps(
                {"run_id": RUN, "event": "run.joining", "timestamp": "2026-01-02T09:59:59Z"}
            ),
            _line(f"2026-01-02T10:00:0{offset}Z", "upload.sent", client_id=client, round=1),
            _line(f"2026-01-02T10:00:03.{offset[2]}Z", "upload.sent", client_id=client, round=2),
        )
    _write(logs / "launcher.jsonl", _line("2026-01-02T09:59:58Z", "broker.started"))
    return run


def _logs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["logs", *args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def _names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["process"], e["event"]) for e in events]


def test_a_run_directory_is_every_process_merged_in_time_order(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, events, err = _logs(capsys, str(run_dir), "--level", "debug")
    assert (code, err) == (0, "")
    times = [datetime.fromisoformat(e["timestamp"]) for e in events]
    assert times == sorted(times)
    assert _names(events)[:4] == [
        ("launcher", "broker.started"),
        ("client-0", "run.joining"),
        ("client-1", "run.joining"),
        ("coordinator", "round.started"),
    ]
    assert len(events) == 13
    assert events[0] == {
        "process": "launcher",
        "run_id": RUN,
        "event": "broker.started",
        "level": "info",
        "timestamp": "2026-01-02T09:59:58Z",
    }
    # files named one by one: the same merge
    files = sorted(str(p) for p in (run_dir / "logs").glob("client-*.jsonl"))
    code, some, _ = _logs(capsys, *files, "--level", "debug")
    assert {e["process"] for e in some} == {"client-0", "client-1"}
    assert len(some) == 6


def test_one_round_across_the_coordinator_and_its_devices(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, quiet, _ = _logs(capsys, str(run_dir), "--round", "2")  # info and up by default
    assert ("coordinator", "upload.accepted") not in _names(quiet)
    _, events, _ = _logs(capsys, str(run_dir), "--round", "2", "--level", "debug")
    assert _names(events) == [
        ("coordinator", "round.started"),
        ("coordinator", "upload.accepted"),
        ("client-0", "upload.sent"),
        ("client-1", "upload.sent"),
        ("coordinator", "upload.rejected"),
        ("coordinator", "round.closed"),
    ]
    # a client: its own lines (also those without a client_id) and the coordinator's about it
    _, events, _ = _logs(capsys, str(run_dir), "--client", "1", "--level", "debug")
    assert _names(events) == [
        ("client-1", "run.joining"),
        ("client-1", "upload.sent"),
        ("coordinator", "upload.accepted"),
        ("client-1", "upload.sent"),
    ]
    _, events, _ = _logs(
        capsys, str(run_dir), "--event", "upload.*", "--event", "*.closed", "--level", "debug"
    )
    assert {e["event"] for e in events} == {
        "upload.sent",
        "upload.accepted",
        "upload.rejected",
        "round.closed",
    }
    assert len(events) == 8
    _, events, _ = _logs(capsys, str(run_dir), "--level", "warning")
    assert _names(events) == [("coordinator", "upload.rejected")]
    _, events, _ = _logs(capsys, str(run_dir), "--level", "info", "--round", "2", "--client", "0")
    assert _names(events) == [("client-0", "upload.sent"), ("coordinator", "upload.rejected")]
    _, events, _ = _logs(capsys, str(run_dir), "-n", "2")
    assert _names(events) == [("coordinator", "upload.rejected"), ("coordinator", "round.closed")]


def test_lines_a_crash_cut_are_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    whole = _line("2026-01-02T10:00:01Z", "upload.sent", client_id="3", round=1)
    _write(
        logs / "client-3.jsonl",
        whole[:40] + _line("2026-01-02T10:00:05Z", "client.started", client_id="3"),  # restarted
        "not json at all",
        json.dumps({"event": "no.timestamp"}),
        json.dumps(["a", "list"]),
        _line("not a time", "bad.time"),
        "\xff\xfe{",
        _line("2026-01-02T10:00:06Z", "run.joined", client_id="3"),
        whole[:30],  # the writer was killed here
        end="",
    )
    _write(logs / "coordinator.jsonl", _line("2026-01-02T10:00:02Z", "round.closed", round=1))
    code, events, err = _logs(capsys, str(tmp_path))
    assert code == 0
    assert _names(events) == [("coordinator", "round.closed"), ("client-3", "run.joined")]
    assert err == (
        "mqttfl logs: skipped 7 lines that are not whole log events (client-3.jsonl: 7)\n"
    )
    # a last line that lacks only its newline is whole
    _write(logs / "coordinator.jsonl", _line("2026-01-02T10:00:02Z", "round.closed"), end="")
    code, events, err = _logs(capsys, str(logs / "coordinator.jsonl"))
    assert (code, _names(events), err) == (0, [("coordinator", "round.closed")], "")


def test_a_missing_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "runs" / "nope"
    assert main(["logs", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"mqttfl: error: {missing}: no such file or directory\n")
    (tmp_path / "empty").mkdir()
    assert main(["logs", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.startswith(f"mqttfl: error: {tmp_path / 'empty'}: no log files")


def test_one_instance_of_a_run_id_across_its_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run id started again (`--clear-run`) appends a second instance to a device's
    log: `--instance` shows one of them, by its id or its first characters, and the
    readable view says the instance where it changes, not on every line."""
    first, second = "aa11bb22cc33dd44", "ee55ff6677889900"
    logs = tmp_path / "logs"
    _write(
        logs / "coordinator.jsonl",
        _line("2026-01-02T10:00:00Z", "run.started", client_id="coordinator", instance=second),
        _line("2026-01-02T10:00:02Z", "round.closed", client_id="coordinator", round=1,
              instance=second),
    )  # fmt: skip
    _write(
        logs / "client-0.jsonl",
        _line("2026-01-02T09:00:00Z", "run.joining", client_id="0"),
        _line("2026-01-02T09:00:01Z", "run.joined", client_id="0", instance=first),
        _line("2026-01-02T09:00:02Z", "upload.sent", client_id="0", round=1, instance=first),
        _line("2026-01-02T09:59:59Z", "run.joining", client_id="0"),
        _line("2026-01-02T10:00:01Z", "run.joined", client_id="0", instance=second),
        _line("2026-01-02T10:00:01.5Z", "upload.sent", client_id="0", round=1, instance=second),
    )  # fmt: skip
    for given in (second, second[:4]):
        code, events, err = _logs(capsys, str(tmp_path), "--instance", given)
        assert (code, err) == (0, "")
        assert _names(events) == [
            ("coordinator", "run.started"),
            ("client-0", "run.joined"),
            ("client-0", "upload.sent"),
            ("coordinator", "round.closed"),
        ]
    _, events, _ = _logs(capsys, str(tmp_path), "--instance", first[:6], "--round", "1")
    assert [(e["event"], e["timestamp"]) for e in events] == [
        ("upload.sent", "2026-01-02T09:00:02Z")
    ]
    assert _logs(capsys, str(tmp_path), "--instance", "0123")[1] == []
    assert main(["logs", str(tmp_path), "--instance", " "]) == 2
    assert capsys.readouterr().err.count("\n") == 1

    assert main(["logs", str(tmp_path), "--text"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("--")]
    said = [line.split()[3] for line in shown if "instance=" in line]
    assert said == ["run.joined", "run.started"]  # the first of each instance only


def test_readable_lines_name_the_process_and_escape_what_a_terminal_would_act_on(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(
        run_dir / "logs" / "client-2.jsonl",
        _line("2026-01-02T10:00:04.5Z", "upload.refused", "error", client_id="2", round=2,
              reason="\x1b[2J\x1b[31mowned", detail={"norm": 1.5}),
    )  # fmt: skip
    assert main(["logs", str(run_dir), "--round", "2", "--text", "--level", "debug"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "-- 2026-01-02 (UTC) --"
    assert lines[1].split() == ["10:00:02.500", "coordinator", "info", "round.started", "round=2"]
    assert lines[2].split()[1:] == [
        "coordinator",
        "debug",
        "upload.accepted",
        "round=2",
        "client=1",
    ]
    refused = next(line for line in lines if "upload.refused" in line)
    reason = 'reason="\\u001b[2J\\u001b[31mowned"'
    assert refused.split()[4:] == ["round=2", reason, 'detail={"norm":1.5}']
    assert refused.split()[:4] == ["10:00:04.500", "client-2", "error", "upload.refused"]
    assert "\x1b" not in out  # no colours when piped, no escape from a peer


def test_it_reads_a_run_without_torch(run_dir: Path) -> None:
    """Any host reads logs: a coordinator host or a sensing device has no torch."""
    code = f"""
import sys
from mqttfl.commands.main import main
assert main(["logs", {str(run_dir)!r}, "--round", "2", "--text"]) == 0
assert "torch" not in sys.modules, "torch was imported"
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "round.closed" in result.stdout


def _on_a_terminal(*args: str) -> str:
    """What `mqttfl ARGS` writes to a terminal (a pseudo-terminal)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqttfl", *args],
        stdout=follower,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "NO_COLOR"},
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    return out.decode()


def test_a_terminal_gets_colours_and_a_pipe_gets_json(run_dir: Path) -> None:
    shown = _on_a_terminal("logs", str(run_dir), "--level", "warning")
    assert "\x1b[33m" in shown
    assert "upload.rejected" in shown
    assert not shown.lstrip().startswith("{")
    piped = subprocess.run(
        [sys.executable, "-m", "mqttfl", "logs", str(run_dir), "--level", "warning"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert json.loads(piped.stdout)["event"] == "upload.rejected"


def test_a_pipe_closed_early_ends_it_quietly(tmp_path: Path) -> None:
    lines = [
        _line(f"2026-01-02T10:{i // 60:02d}:{i % 60:02d}Z", "round.closed") for i in range(3000)
    ]
    _write(tmp_path / "logs" / "coordinator.jsonl", *lines)
    result = subprocess.run(
        f"{sys.executable} -m mqttfl logs {tmp_path} | head -1",
        shell=True, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert json.loads(result.stdout)["event"] == "round.closed"
    assert result.stderr == ""


WRITER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    run = Path(sys.argv[1])
    def line(at, event, **fields):
        return json.dumps({**fields, "event": event, "level": "info", "timestamp": at}) + "\\n"
    go = run / "go"
    while not go.exists():  # until the reader has read what was there
        time.sleep(0.05)
    with open(run / "logs" / "coordinator.jsonl", "a") as log:
        log.write(line("2026-01-02T10:00:10Z", "round.started", round=3)); log.flush()
        half = line("2026-01-02T10:00:11Z", "round.closed", round=3)
        log.write(half[:25]); log.flush()  # a line being written...
        time.sleep(1.0)
        log.write(half[25:]); log.flush()  # ...and its end, after the reader looked
    time.sleep(0.5)
    with open(run / "logs" / "client-7.jsonl", "a") as log:  # a device that joins later
        log.write(line("2026-01-02T10:00:12Z", "run.joined", client_id="7")); log.flush()
    """
)


@contextlib.contextmanager
def _started(*args: str, module: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """`mqttfl ARGS` (or `python ARGS`) running, its output piped; killed if the test
    ends first."""
    argv = [sys.executable, *(["-m", "mqttfl"] if module else []), *args]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _read_json_lines(proc: subprocess.Popen[bytes], count: int, *, timeout: float) -> list[Any]:
    assert proc.stdout is not None
    lines: list[Any] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while len(lines) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out after {lines}"
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"the follower ended: {lines}"
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            lines += [json.loads(line) for line in done]
    return lines


def test_follow_shows_what_another_process_writes_until_ctrl_c(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(run / "logs" / "coordinator.jsonl", _line("2026-01-02T10:00:00Z", "run.started"))
    with (
        _started("logs", str(run), "--follow", "--json") as follower,
        _started("-c", WRITER, str(run), module=False) as writer,
    ):
        (first,) = _read_json_lines(follower, 1, timeout=60)
        assert (first["process"], first["event"]) == ("coordinator", "run.started")
        (run / "go").touch()
        later = _read_json_lines(follower, 3, timeout=60)
        assert [(e["process"], e["event"]) for e in later] == [
            ("coordinator", "round.started"),
            ("coordinator", "round.closed"),  # whole, once its newline came
            ("client-7", "run.joined"),
        ]
        assert writer.wait(timeout=30) == 0
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        assert follower.stderr is not None
        assert follower.stderr.read() == b""  # no traceback, nothing skipped


def test_follow_waits_for_a_run_directory_to_get_its_logs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.lock").write_text("1\n")  # a run directory, its logs/ not made yet
    _write(run / "metrics.jsonl", json.dumps({"round": 1, "client_id": "0"}))  # not a log
    with _started("logs", str(run), "-f", "--round", "1") as follower:
        time.sleep(1.0)  # it has looked at the empty directory
        _write(
            run / "logs" / "coordinator.jsonl",
            _line("2026-01-02T10:00:00Z", "round.started", round=2),
            _line("2026-01-02T10:00:01Z", "round.started", round=1),
        )
        (event,) = _read_json_lines(follower, 1, timeout=60)
        assert (event["event"], event["round"]) == ("round.started", 1)
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        assert follower.stderr is not None
        assert follower.stderr.read() == b""


def test_every_line_says_which_process_and_which_start_of_it_wrote_it(tmp_path: Path) -> None:
    """Two starts of one device appending to one file are told apart by ``start``."""
    log = tmp_path / "client-3.jsonl"
    code = (
        "import sys; from pathlib import Path; from mqttfl.logs import configure_logging, "
        "get_logger; configure_logging(Path(sys.argv[1]), console=None); "
        "get_logger(client_id='3').info('client.started')"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code, str(log)], check=True, cwd=REPO)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["process"] for line in lines] == ["client-3", "client-3"]
    assert all(isinstance(line["pid"], int) for line in lines)
    assert lines[0]["start"] != lines[1]["start"]
    shown = mqttfl("logs", str(log), "--text")
    assert shown.returncode == 0, shown.stderr
    assert "start=" not in shown.stdout.splitlines()[-2]  # the first start: said by its column
    assert f"start={lines[1]['start']}" in shown.stdout.splitlines()[-1]


def test_a_process_tags_every_later_line_with_its_run_instance(tmp_path: Path) -> None:
    """Once tagged, every line carries the instance, whichever logger writes it; a line
    that names its own instance keeps it."""
    log = tmp_path / "client-3.jsonl"
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from mqttfl.logs import configure_logging, get_logger, tag_process
        configure_logging(Path(sys.argv[1]), console=None)
        get_logger(client_id="3").info("run.joining")
        tag_process(instance="abc123")
        get_logger(client_id="3").info("run.joined")
        get_logger(component="bus").info("broker.connected")
        get_logger(client_id="3").info("manifest.received", instance="other")
        """
    )
    subprocess.run([sys.executable, "-c", code, str(log)], check=True, cwd=REPO)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["event"], line.get("instance")) for line in lines] == [
        ("run.joining", None),
        ("run.joined", "abc123"),
        ("broker.connected", "abc123"),
        ("manifest.received", "other"),
    ]
