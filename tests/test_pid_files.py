"""A client device's process can be found: it is named ``c<id>@<run id>`` (what ps and
``pgrep -x`` show) and keeps a locked pid file beside its state, which it removes at a
clean exit; ``pkill -9 -L -F FILE``, the README's command, kills that process alone, and
nothing once the process is gone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttfl.pidfile import client_process_name, pid_file
from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import RUN_ID, Federation
from tests.helpers import REPO

#: a process that is client ID of RUN until its stdin closes (argv: state dir, run, id)
CLIENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mqttfl.errors import MqttflError
    from mqttfl.logs import configure_logging
    from mqttfl.pidfile import findable_client
    configure_logging(None, console=None)
    try:
        with findable_client(Path(sys.argv[1]), sys.argv[2], sys.argv[3]) as path:
            print(path, flush=True)
            sys.stdin.read()
    except MqttflError as exc:
        print(f"error: {exc}", flush=True)
    """
)


@contextlib.contextmanager
def _client(state: Path, run: str, client: str) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(state), run, client],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as a user types it."""
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_the_name_holds_the_id_whole_and_as_much_of_the_run_as_fits() -> None:
    assert client_process_name("fedapa-csi", "3") == "c3@fedapa-csi"
    assert client_process_name("fedapa-csi-lab-2026", "12") == "c12@fedapa-csi-"
    assert len(client_process_name("r", "x" * 64)) == 15


def test_a_client_process_is_named_and_holds_its_pid_file_until_a_clean_exit(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with _client(state, "fedapa-csi", "3") as proc:
        path = Path(_first_line(proc))
        assert path == pid_file(state, "fedapa-csi", "3") == state / "fedapa-csi" / "client-3.pid"
        assert path.read_text() == f"{proc.pid}\n"
        assert _comm(proc.pid) == "c3@fedapa-csi"
        # (another test's client 3 of a run fedapa-csi may be named so too)
        assert str(proc.pid) in _sh("pgrep -x c3@fedapa-csi").stdout.split()
        assert _sh(f"pgrep -L -F {path}").stdout.split() == [str(proc.pid)]  # locked: live
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    assert not path.exists()


def test_pkill_by_the_pid_file_kills_the_device_and_never_a_stranger(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _client(state, "run-a", "3") as proc, _client(state, "run-b", "3") as other:
        path = Path(_first_line(proc))
        _first_line(other)
        result = _sh(f"pkill -9 -L -F {path}")
        assert result.returncode == 0, result.stderr
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None  # the same id in another run: alive
        # Left by a killed process, the file is not locked: nothing is killed by it, not
        # even a process that took the dead one's pid (here: any pid of ours).
        path.write_text(f"{other.pid}\n")
        assert _sh(f"pkill -9 -L -F {path}").returncode != 0
        assert other.poll() is None


def test_a_second_process_of_the_client_keeps_its_own_pid_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with _client(state, "fedapa-csi", "3") as first:
        path = Path(_first_line(first))
        with _client(state, "fedapa-csi", "3") as second:
            _first_line(second)
            assert path.read_text() == f"{second.pid}\n"
            assert first.stdin is not None
            first.stdin.close()
            assert first.wait(timeout=30) == 0
            assert path.read_text() == f"{second.pid}\n"  # not the first one's to remove
            assert second.stdin is not None
            second.stdin.close()
            assert second.wait(timeout=30) == 0
    assert not path.exists()


def test_a_link_where_the_pid_file_goes_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (state / "fedapa-csi").mkdir(parents=True)
    (state / "fedapa-csi" / "client-3.pid").symlink_to(target)
    with _client(state, "fedapa-csi", "3") as proc:
        line = _first_line(proc)
        assert proc.wait(timeout=30) == 0
    assert line.startswith(f"error: {state / 'fedapa-csi' / 'client-3.pid'} is a symbolic link")
    assert target.read_text() == "keep me\n"


@pytest.mark.slow
def test_a_device_of_a_real_run_is_found_and_killed_by_its_pid_file(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path, broker, clients=2, rounds=3) as fed:
        fed.start()
        files = {cid: pid_file(fed.state_dir, RUN_ID, cid) for cid in ("0", "1")}
        fed.wait_for(
            lambda: all(path.exists() for path in files.values()),
            timeout=120,
            what="both clients' pid files",
        )
        for cid, path in files.items():
            pid = fed.pid(cid)  # `python -m mqttfl client`, started alone
            assert path.read_text() == f"{pid}\n"
            assert _comm(pid) == f"c{cid}@{RUN_ID}"
            assert str(pid) in _sh(f"pgrep -x c{cid}@{RUN_ID}").stdout.split()
        fed.wait_round_closed(1, timeout=120)
        killed = _sh(f"pkill -9 -L -F {files['1']}")  # the README's command
        assert killed.returncode == 0, killed.stderr
        assert fed.procs["1"].wait(timeout=30) == -signal.SIGKILL
        assert fed.alive("0")
        fed.wait_for(
            lambda: fed.events("coordinator", "client.offline"), timeout=60, what="its last will"
        )
        assert files["1"].exists()  # a kill -9 runs no cleanup; the file is not locked now
        assert _sh(f"pkill -9 -L -F {files['1']}").returncode != 0
        fed.restart("1")  # resumes, under the same name, with a pid file of its own
        fed.wait_for(
            lambda: files["1"].read_text() == f"{fed.pid('1')}\n",
            timeout=120,
            what="the restarted client's pid file",
        )
        fed.finish(timeout=300)
    assert not files["0"].exists()
    assert not files["1"].exists()
    offline = next(e for e in fed.events("coordinator", "client.offline") if e["client"] == "1")
    assert offline["reason"] == "connection lost"
