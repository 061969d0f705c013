"""ESPectre's recordings are obtained where they are not here: from a mirror, each file
checked against its SHA-256, into a cache that is complete or absent; a fetch that fails
says so in one line, with what to do."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqttfl.data.espectre_files import ESPECTRE_COMMIT, FILES, espectre_root
from mqttfl.errors import DataError
from tests._shared_data import require_shared
from tests.helpers import mqttfl


@pytest.fixture
def shared() -> Path:
    """This machine's copy of the recordings (read before a test hides it)."""
    return require_shared("espectre")


@pytest.fixture
def mirror(shared: Path, tmp_path: Path) -> Path:
    """A directory laid out as the ESPectre repository at the pinned commit."""
    root = tmp_path / "mirror"
    for name in FILES:
        target = root / (name if name == "LICENSE" else f"micro-espectre/data/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared / name, target)
    return root


@pytest.fixture
def served(mirror: Path) -> Iterator[str]:
    """The mirror over HTTP on a loopback port."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fresh(shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with no shared data and an empty cache."""
    monkeypatch.setenv("MQTTFL_SHARED_DATA", str(tmp_path / "no-shared-data"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("MQTTFL_CACHE_DIR", str(cache))
    return cache


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_recordings_come_from_a_served_mirror_into_the_cache_once(
    shared: Path, fresh: Path, served: str, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQTTFL_ESPECTRE_MIRROR", served)
    root = espectre_root()
    assert root == fresh / "espectre" / ESPECTRE_COMMIT[:12]
    for name in FILES:
        assert (root / name).read_bytes() == (shared / name).read_bytes()
    assert [p.name for p in fresh.joinpath("espectre").iterdir()] == [root.name]  # no leftovers
    shutil.rmtree(mirror)  # found in the cache from now on: the mirror is not asked again
    assert espectre_root() == root


def test_a_directory_mirror_serves_as_well(
    fresh: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQTTFL_ESPECTRE_MIRROR", str(mirror))
    root = espectre_root()
    info = json.loads((root / "dataset_info.json").read_text())
    assert {"baseline", "movement", "test"} <= set(info["files"])


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_is_kept(
    fresh: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tampered = (
        mirror
        / "micro-espectre/data/movement"
        / sorted(p.name for p in (mirror / "micro-espectre/data/movement").iterdir())[0]
    )
    data = bytearray(tampered.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of a recording changed
    tampered.write_bytes(bytes(data))
    monkeypatch.setenv("MQTTFL_ESPECTRE_MIRROR", str(mirror))
    with pytest.raises(DataError, match="SHA-256") as info:
        espectre_root()
    assert tampered.name in str(info.value)
    assert "\n" not in str(info.value)
    assert not (fresh / "espectre" / ESPECTRE_COMMIT[:12]).exists()
    assert list((fresh / "espectre").iterdir()) == []  # the staging folder went too


def test_an_unreachable_mirror_is_one_line_saying_what_to_do(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQTTFL_ESPECTRE_MIRROR", f"http://127.0.0.1:{_closed_port()}/")
    with pytest.raises(DataError) as info:
        espectre_root()
    text = str(info.value)
    assert "\n" not in text
    assert "fetching them failed" in text
    assert ESPECTRE_COMMIT[:12] in text
    assert "MQTTFL_ESPECTRE_MIRROR" in text
    assert "data.path" in text


def test_a_linked_cache_entry_is_not_trusted(
    fresh: Path, mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "dataset_info.json").write_text("{}")
    link = fresh / "espectre" / ESPECTRE_COMMIT[:12]
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    monkeypatch.setenv("MQTTFL_ESPECTRE_MIRROR", str(mirror))
    with pytest.raises(DataError, match="cannot be written"):
        espectre_root()
    assert (elsewhere / "dataset_info.json").read_text() == "{}"  # the link's target untouched


class _SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the mirror a file every half second: a fetch is caught in the middle."""

    def do_GET(self) -> None:
        time.sleep(0.5)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_fetch_killed_midway_leaves_nothing_for_the_next_one(
    fresh: Path, mirror: Path, tmp_path: Path
) -> None:
    """kill -9 during a fetch: the cache holds no recordings (the folder is moved in whole),
    and the next fetch removes the dead one's staging folder; a live fetch's is kept."""
    handler = functools.partial(_SlowHandler, directory=str(mirror))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "MQTTFL_SHARED_DATA": str(tmp_path / "no-shared-data"),
        "MQTTFL_CACHE_DIR": str(fresh),
        "MQTTFL_ESPECTRE_MIRROR": f"http://127.0.0.1:{server.server_address[1]}/",
    }
    code = "from mqttfl.data.espectre_files import espectre_root; espectre_root()"
    fetcher = subprocess.Popen([sys.executable, "-c", code], env=env)
    folder = fresh / "espectre"
    try:
        deadline = time.monotonic() + 60
        while not any(p.is_file() for p in folder.glob(".fetching-*/**/*")):
            assert fetcher.poll() is None, "the fetch ended before it could be killed"
            assert time.monotonic() < deadline, "no staging folder appeared"
            time.sleep(0.05)
        fetcher.send_signal(signal.SIGKILL)
        fetcher.wait()
    finally:
        server.shutdown()
        server.server_close()
    orphaned = [p for p in folder.iterdir() if p.name.startswith(".fetching-")]
    assert orphaned
    assert not (folder / ESPECTRE_COMMIT[:12]).exists()
    live = folder / f".fetching-{os.getpid()}-live"  # this process: alive, so not touched
    live.mkdir()
    env["MQTTFL_ESPECTRE_MIRROR"] = str(mirror)
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted([ESPECTRE_COMMIT[:12], live.name])


@pytest.mark.slow
def test_the_presence_job_runs_on_a_fresh_machine_from_a_mirror(
    fresh: Path, served: str, tmp_path: Path
) -> None:
    env = {
        "MQTTFL_SHARED_DATA": str(tmp_path / "no-shared-data"),
        "MQTTFL_CACHE_DIR": str(fresh),
        "MQTTFL_ESPECTRE_MIRROR": served,
    }
    out = tmp_path / "run"
    job = ["run", "configs/presence-espectre.toml", "--no-local-reference", "--set", "rounds=1"]
    result = mqttfl(*job, "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["clients"]) == {"0", "1", "2", "3", "4"}
    assert (fresh / "espectre" / ESPECTRE_COMMIT[:12] / "LICENSE").is_file()
    # and where no mirror answers, the same command is one line, exit 2
    down = {**env, "MQTTFL_CACHE_DIR": str(tmp_path / "cache2")}
    down["MQTTFL_ESPECTRE_MIRROR"] = f"http://127.0.0.1:{_closed_port()}/"
    refused = mqttfl(*job, "--out", str(tmp_path / "run2"), env=down)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("mqttfl: error: "), refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "MQTTFL_ESPECTRE_MIRROR" in refused.stderr
