"""A run directory in use: everything `mqttfl run` started ends with it, even after
``kill -9``; one run at a time holds the directory; no run file is written through a
symbolic link; a run id or client id cannot lead out of its directory.

The end-to-end tests drive the real command line: a Mosquitto of the run's own, a
coordinator and client processes, on the tiny model.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqttfl.config import load_config
from mqttfl.errors import ConfigError, FileError, WireError
from mqttfl.files import append_line, write_atomic
from mqttfl.logs import configure_logging
from mqttfl.paths import LOCK_FILE, claim_run_dir
from mqttfl.provisioning.broker_init import write_password_file
from mqttfl.provisioning.local_broker import LocalBroker, port_open
from mqttfl.wire.ids import check_id
from tests.faults import CONFIG, TINY, read_events
from tests.helpers import REPO, mqttfl
from tests.run_files import one_line_error

SMALL = [*TINY, "federation.num_clients=2", "federation.min_clients=2"]
#: how long the processes of a run may outlive its launcher killed by ``kill -9``
ORPHAN_S = 10.0
PRECIOUS = b"not the run's\n"


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _run_args(out: Path, *extra: str) -> list[str]:
    return [
        "run",
        CONFIG,
        "--out",
        str(out),
        "--plain",
        "--no-local-reference",
        *_sets([*SMALL, *extra]),
    ]


def _start_run(out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`mqttfl run` in the background; what it writes goes to ``<out>.stderr``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".stderr"), "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "mqttfl", *_run_args(out, *extra)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=REPO,
        )


def _coordinator_of(out: Path) -> int:
    """The pid of the coordinator that ``mqttfl run`` started for ``out``."""
    for pid in _pids_mentioning(str(out)):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"coordinator" in argv:
            return pid
    raise AssertionError(f"no coordinator of {out} is running")


def _pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line names ``text`` (every process of a run names
    its run directory: the broker its conf, the clients their state dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` held; AssertionError naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:.0f} s")


def _round_started(out: Path, number: int) -> bool:
    return any(
        e.get("event") == "round.started" and e.get("round") == number
        for e in read_events(out / "logs" / "coordinator.jsonl")
    )


@pytest.fixture
def reap(tmp_path: Path) -> Iterator[None]:
    """Whatever process of this test outlives it (the code under test failing) is killed,
    by pid: every process of a run names its directory, under ``tmp_path``."""
    yield
    for pid in _pids_mentioning(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- the launcher's processes end with it -------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("reap")
def test_kill_9_of_the_launcher_ends_the_broker_coordinator_and_clients(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = _start_run(out, "rounds=100000")
    try:
        _wait_for("round 3 started", lambda: _round_started(out, 3), 90)
        # the launcher, the broker, the coordinator, the clients' parent and its two clients
        assert len(_pids_mentioning(str(out))) >= 6, _pids_mentioning(str(out))
        conf = (out / "broker" / "mosquitto.conf").read_text()
        listener = re.search(r"^listener (\d+)", conf, re.M)
        assert listener is not None, conf
        port = int(listener.group(1))
        assert port_open(port)
        launcher.kill()
        launcher.wait()
        _wait_for("every process of the run gone", lambda: not _pids_mentioning(str(out)), ORPHAN_S)
        assert not port_open(port)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# --- one run at a time in a run directory ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("reap")
def test_a_second_run_on_the_same_out_stops_in_one_line_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _start_run(out, "rounds=6")
    coordinator_pid = 0
    try:
        _wait_for("round 1 started", lambda: _round_started(out, 1), 90)
        # its coordinator paused: the first run is surely still going while the others try
        coordinator_pid = _coordinator_of(out)
        os.kill(coordinator_pid, signal.SIGSTOP)
        passwd = (out / "broker" / "passwd").read_bytes()
        second = mqttfl(*_run_args(out, "rounds=6"), timeout=120)
        line = one_line_error(second)
        assert f"--out {out} is in use by process {first.pid}" in line, line
        coordinator = mqttfl(
            "coordinator",
            "--config",
            CONFIG,
            "--broker",
            "mqtt://127.0.0.1:1",
            "--out",
            str(out),
            *_sets(SMALL),
            timeout=120,
        )
        assert f"in use by process {first.pid}" in one_line_error(coordinator)
        assert (out / "broker" / "passwd").read_bytes() == passwd  # its credentials stand
        os.kill(coordinator_pid, signal.SIGCONT)
        assert first.wait(timeout=180) == 0, (tmp_path / "run.stderr").read_text()[-3000:]
    finally:
        if coordinator_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(coordinator_pid, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (out / "summary.json").is_file()
    assert (out / LOCK_FILE).read_text().strip() == str(first.pid)
    # neither of the refused wrote into the first's logs
    launcher_log = read_events(out / "logs" / "launcher.jsonl")
    assert [e["event"] for e in launcher_log].count("broker.started") == 1
    assert not re.search(r"127\.0\.0\.1:1\b", (out / "logs" / "coordinator.jsonl").read_text())


def test_the_lock_passes_to_a_child_given_its_descriptor(tmp_path: Path) -> None:
    out = tmp_path / "run"
    lock = claim_run_dir(out)
    try:
        claim = (
            "from pathlib import Path; from mqttfl.paths import claim_run_dir; "
            f"claim_run_dir(Path({str(out)!r}))"
        )
        stranger = subprocess.run(
            [sys.executable, "-c", claim], capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert stranger.returncode != 0
        assert f"in use by process {os.getpid()}" in stranger.stderr
        heir = subprocess.run(
            [sys.executable, "-c", claim],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            env={**os.environ, **lock.child_env()},
            pass_fds=(lock.fd,),
        )
        assert heir.returncode == 0, heir.stderr
    finally:
        os.close(lock.fd)
    os.close(claim_run_dir(out).fd)  # free once its holder let go


# --- no run file is written through a link ---------------------------------------------------
@pytest.mark.usefixtures("reap")
@pytest.mark.parametrize(
    "planted", ["broker/passwd", "logs/coordinator.jsonl", "logs/launcher.jsonl", "metrics.jsonl"]
)
def test_a_link_planted_in_the_run_directory_is_refused(tmp_path: Path, planted: str) -> None:
    target = tmp_path / "target"
    target.write_bytes(PRECIOUS)
    out = tmp_path / "run"
    link = out / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    result = mqttfl(*_run_args(out, "rounds=1"), timeout=180)
    line = one_line_error(result)
    assert line.startswith(f"mqttfl: error: {link} is a symbolic link"), line
    assert target.read_bytes() == PRECIOUS
    assert _pids_mentioning(str(out)) == []


@pytest.mark.usefixtures("reap")
def test_an_out_that_is_a_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    out = tmp_path / "run"
    out.symlink_to(target)
    result = mqttfl(*_run_args(out, "rounds=1"), timeout=180)
    line = one_line_error(result)
    assert line.startswith(f"mqttfl: error: --out {out} is a symbolic link"), line
    assert list(target.iterdir()) == []


def _planted(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A link ``run/<name>`` to a file that is not the run's."""
    target = tmp_path / "target"
    target.write_bytes(PRECIOUS)
    link = tmp_path / "run" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link, target


WRITERS: dict[str, Callable[[Path], object]] = {
    "metrics.jsonl": lambda path: append_line(path, '{"round": 1}'),
    "summary.json": lambda path: write_atomic(path, b"{}"),
    "coordinator.jsonl": lambda path: configure_logging(path, console_level="off"),
    "passwd": lambda path: write_password_file(path, {"coordinator": "secret"}),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_writer_never_follows_a_link_planted_while_the_run_goes_on(
    tmp_path: Path, name: str
) -> None:
    # What the check at the start cannot see: a link planted once the run is under way.
    link, target = _planted(tmp_path, name)
    with pytest.raises(FileError, match=re.escape(f"{link} is a symbolic link")):
        WRITERS[name](link)
    assert target.read_bytes() == PRECIOUS
    assert link.is_symlink()
    assert sorted(p.name for p in link.parent.iterdir()) == [name]  # no temporary left


def test_a_local_broker_refuses_a_link_in_its_directory(tmp_path: Path) -> None:
    link, target = _planted(tmp_path, "mosquitto.log")
    broker = LocalBroker(link.parent)
    try:
        with pytest.raises(FileError, match=re.escape(f"{link} is a symbolic link")):
            broker.start()
        assert broker.process is None
    finally:
        broker.stop()
    assert target.read_bytes() == PRECIOUS


# --- ids that stay inside their directories --------------------------------------------------
#: not one path component of its own: '..' and '.' pass the id pattern, the rest do not
NO_COMPONENT = ["..", ".", "a/b", "/", "", "a\\b", "a\0b"]


def test_a_run_id_that_is_no_directory_of_its_own_is_a_config_error() -> None:
    for run_id in NO_COMPONENT:
        with pytest.raises(ConfigError) as raised:
            load_config(None, [f"run_id={run_id}"])
        assert raised.value.key == "run_id", run_id


def test_a_client_id_that_is_no_file_name_of_its_own_is_refused() -> None:
    for client_id in NO_COMPONENT:
        with pytest.raises(WireError):
            check_id(client_id)


@pytest.mark.usefixtures("reap")
def test_run_with_run_id_dotdot_stops_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = mqttfl(*_run_args(out, "rounds=1", "run_id=.."), timeout=180)
    assert one_line_error(result).startswith("mqttfl: error: config key 'run_id': '..'")
    assert not out.exists()


def test_client_with_id_dotdot_stops_in_one_line(tmp_path: Path) -> None:
    result = mqttfl(
        "client",
        "--run",
        "fedapa-csi",
        "--id",
        "..",
        "--broker",
        "mqtt://127.0.0.1:1",
        "--state-dir",
        str(tmp_path / "state"),
        "--wait",
        "1",
        env={"MQTTFL_LOG_DIR": str(tmp_path / "logs")},
        timeout=60,
    )
    assert one_line_error(result).startswith("mqttfl: error: --id: client id '..'")
    assert not (tmp_path / "logs").exists()
