"""`mqttfl run` forks its clients from one `mqttfl clients` parent: each is its
own OS process with its own MQTT session and last will, killable alone with kill -9,
and the round goes on without it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import read_events, wait_for
from tests.helpers import FAST, REPO, mqttfl

pytestmark = pytest.mark.slow
CONFIG = "configs/fedapa-csi.toml"


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_forked_client_killed_with_sigkill_fires_its_will_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "mqttfl", "run", CONFIG, "--plain", "--no-local-reference"]
    argv += ["--out", str(out)]
    for item in ["rounds=6", "federation.num_clients=3", *FAST]:
        argv += ["--set", item]
    with open(tmp_path / "run.out", "wb") as handle:
        run = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    logs = out / "logs"
    try:

        def forked() -> dict[str, int]:
            events = read_events(logs / "clients-0-2.jsonl")
            return {e["client"]: e["pid"] for e in events if e["event"] == "client.forked"}

        def closed() -> list[int]:
            events = read_events(logs / "coordinator.jsonl")
            return [e["round"] for e in events if e["event"] == "round.closed"]

        wait_for(
            lambda: len(forked()) == 3 and 2 in closed(), timeout=180, what="the run to get there"
        )
        pids = forked()
        assert len(set(pids.values())) == 3
        pid_files = {c: out / "clients" / "fedapa-csi" / f"client-{c}.pid" for c in pids}
        for client, pid in pids.items():  # each a process of its own, named for pgrep -x
            assert Path(f"/proc/{pid}/comm").read_text().strip() == f"c{client}@fedapa-csi"
            assert pid_files[client].read_text() == f"{pid}\n"
        assert len({_ppid(pid) for pid in pids.values()}) == 1  # one parent forked them all
        killed = subprocess.run(  # that process alone, as the README kills one
            ["pkill", "-9", "-L", "-F", str(pid_files["2"])], capture_output=True, timeout=30
        )
        assert killed.returncode == 0, killed.stderr
        killed_after = max(closed())
        assert run.wait(timeout=300) == 0, (tmp_path / "run.out").read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()

    events = read_events(logs / "coordinator.jsonl")
    offline = [e for e in events if e["event"] == "client.offline" and e["client"] == "2"]
    assert offline, "no last will for the killed client"
    assert offline[0]["reason"] == "connection lost"
    rounds = {e["round"]: e for e in events if e["event"] == "round.closed"}
    assert sorted(rounds) == [1, 2, 3, 4, 5, 6]
    for t in range(killed_after + 2, 7):  # wholly after the kill: the two survivors
        assert rounds[t]["uploads"] == 2
    exits = {e["client"]: e["code"] for e in read_events(logs / "clients-0-2.jsonl") if "code" in e}
    assert exits == {"0": 0, "1": 0, "2": -signal.SIGKILL}
    assert [c for c, path in pid_files.items() if path.exists()] == ["2"]  # clean exits: gone


def test_mqttfl_clients_refuses_bad_ids_before_it_forks(tmp_path: Path) -> None:
    """The command a user starts by hand: a reversed range is one line, no traceback."""
    result = mqttfl("clients", "--config", CONFIG, "--ids", "3-1", "--broker", "mqtt://127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.startswith("mqttfl: error: --ids")
    assert "Traceback" not in result.stderr
