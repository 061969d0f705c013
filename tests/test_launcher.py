"""`mqttfl run` stops everything it started: when its clients all die, on Ctrl-C and on
SIGTERM; its local broker takes only the run's own generated identities."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import FAST, REPO, mqttfl, processes_mentioning

pytestmark = pytest.mark.slow

SMALL = [
    *FAST,
    "federation.num_clients=2",
    "federation.min_clients=2",
    "rounds=50",
]


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_missing_shards_directory_fails_before_starting_anything(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        *_sets([*SMALL, "data.source=shards", "data.path=/nonexistent"]),
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "mqttfl: error: config key 'data.path': /nonexistent is not a directory\n"
    )
    assert not (out / "broker").exists()
    assert processes_mentioning(str(out)) == []


def test_clients_without_shards_stop_the_run_before_it_starts(tmp_path: Path) -> None:
    # client-<id>/ directories exist but hold no shard: `mqttfl run` reads every client's
    # shard for its shape check before it starts anything, and names the missing file
    # (the clients would each fail as they start, and the coordinator wait for them).
    shards = tmp_path / "shards"
    for index in range(2):
        (shards / f"client-{index}").mkdir(parents=True)
    out = tmp_path / "run"
    started = time.monotonic()
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        *_sets([*SMALL, "data.source=shards", f"data.path={shards}"]),
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"mqttfl: error: {shards / 'client-0' / 'shard.npz'}: file not found"
    assert elapsed < 60  # the join timeout alone would be 60 s
    assert processes_mentioning(str(out)) == []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_tears_everything_down(tmp_path: Path, signum: int, code: int) -> None:
    out = tmp_path / "run"
    # files, not pipes: a run of many rounds writes more than a pipe holds while this test
    # is not reading, and a full pipe would stall the launcher
    with (
        (tmp_path / "run.stdout").open("wb") as stdout,
        (tmp_path / "run.stderr").open("wb") as stderr_file,
    ):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mqttfl",
                "run",
                "configs/fedapa-csi.toml",
                "--out",
                str(out),
                # rounds of this size take ~70 ms: enough of them that the run is still
                # going when the signal comes, however long the checks below take
                *_sets([*SMALL, "rounds=100000"]),
            ],
            stdout=stdout,
            stderr=stderr_file,
            cwd=REPO,
        )
    try:
        log = out / "logs" / "coordinator.jsonl"
        deadline = time.monotonic() + 60
        # the clients have joined and the first round runs
        while time.monotonic() < deadline and not (
            log.exists() and "round.started" in log.read_text()
        ):
            time.sleep(0.2)
        running = processes_mentioning(str(out))
        assert any("mosquitto" in cmd for cmd in running), running
        assert len(running) >= 4, running
        # The run's own broker takes only this run's generated identities.
        conf = (out / "broker" / "mosquitto.conf").read_text()
        listener = re.search(r"^listener (\d+)", conf, re.M)
        assert listener is not None, conf
        port = listener.group(1)
        anonymous = subprocess.run(
            ["mosquitto_pub", "-p", port, "-t", "mqttfl/fedapa-csi/round/1/start", "-m", "x"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert anonymous.returncode != 0
        assert "not authori" in anonymous.stderr.lower()
        assert "allow_anonymous false" in conf
        assert (out / "broker" / "acl").exists()
        proc.send_signal(signum)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = (tmp_path / "run.stderr").read_text(errors="replace")
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr
    assert processes_mentioning(str(out)) == []
