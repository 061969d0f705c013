"""Install by role: `pip install mqttfl` alone, in a fresh venv where torch
cannot be imported, is a coordinator host and a sensing device. Its `broker init`,
`watch --once`, coordinator (of a federation whose clients are torch processes of this
checkout's venv) and `sense` (on that run's client, exported with torch here) all run;
a training command says in one line which extra to install.

The venv is built once for the module from a copy of the package's sources (what a
wheel of this checkout holds; a build inside the checkout would leave `build/` there,
and a stale `build/lib` can slip deleted modules into the wheel). It needs the package
index: offline the module skips, except in CI (`CI=true` or MQTTFL_REQUIRE_SHARED_DATA),
where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_install_roles import package_source
from mqttfl.data.shard import load_shard
from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import CONFIG, RUN_ID, TINY, read_events, wait_for
from tests.helpers import REPO, mqttfl

pytestmark = pytest.mark.slow

# What pip prints when it cannot reach the index; "from versions: none" is an index that
# answers nothing (or no index at all: `pip install --retries 0` offline says only that).
OFFLINE = (
    "(from versions: none)",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
)
TRAIN_EXTRA = "install the training extra: pip install 'mqttfl[train]'"


def _must_not_skip() -> bool:
    return os.environ.get("CI") == "true" or bool(os.environ.get("MQTTFL_REQUIRE_SHARED_DATA"))


def _base_env() -> dict[str, str]:
    """This process's environment, less anything that would put the checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin/ of a fresh venv holding `pip install mqttfl` (no extras); its 450 MB are
    removed after the module."""
    root = tmp_path_factory.mktemp("install-roles")
    source = package_source(root)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    started = time.monotonic()
    install = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
        env=_base_env(),
    )
    output = install.stdout + install.stderr
    if install.returncode != 0:
        if any(marker in output for marker in OFFLINE) and not _must_not_skip():
            said = [
                line.strip() for line in output.splitlines() if "ERROR" in line or "WARN" in line
            ]
            pytest.skip(f"pip cannot reach the package index: {(said or ['?'])[-1]}")
        pytest.fail(f"pip install of the base package failed:\n{output[-3000:]}")
    sys.stderr.write(f"base venv installed in {time.monotonic() - started:.0f} s\n")
    yield venv / "bin"
    shutil.rmtree(venv, ignore_errors=True)


def _run(
    base: Path, *args: str, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`mqttfl ARGS` of the torch-free venv (started outside the checkout)."""
    return subprocess.run(
        [str(base / "mqttfl"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=_base_env(),
    )


def test_the_base_install_has_no_torch(base: Path, tmp_path: Path) -> None:
    probe = subprocess.run(
        [str(base / "python"), "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_base_env(),
    )
    assert probe.returncode != 0
    assert "No module named 'torch'" in probe.stderr
    listed = subprocess.run(
        [str(base / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_base_env(),
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "mqttfl" in installed
    assert not installed & {"torch", "onnx", "onnxscript", "csiread", "scikit-learn", "mlxtend"}


def test_broker_init_runs_without_torch(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "broker-setup"
    result = _run(base, "broker", "init", "--clients", "2", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("mosquitto.conf", "passwd", "acl", "credentials/coordinator.env"):
        assert (out / name).is_file(), name
    assert (out / "credentials" / "1.env").read_text().strip()


@pytest.mark.parametrize(
    "args",
    [
        ["client", "--id", "0", "--broker", "mqtt://127.0.0.1:1"],
        ["fleet", "--ids", "0,1", "--broker", "mqtt://127.0.0.1:1"],
        ["run", str(REPO / CONFIG), "--out", "{tmp}/run"],
        ["compare", str(REPO / CONFIG), "--out", "{tmp}/compare"],
        ["export", "{tmp}", "--client", "0", "--out", "{tmp}/export"],
        ["models"],
    ],
    ids=lambda args: args[0],
)
def test_a_training_command_names_the_training_extra(
    base: Path, tmp_path: Path, args: list[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = _run(base, *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"mqttfl: error: 'mqttfl {args[0]}' needs torch: {TRAIN_EXTRA}\n"
    assert "Traceback" not in result.stdout + result.stderr


def test_a_vendor_capture_names_the_capture_extra(base: Path, tmp_path: Path) -> None:
    capture = tmp_path / "room.dat"
    capture.write_bytes(bytes(range(256)))
    result = _run(
        base,
        *("data", "prepare", "--format", "intel5300", "--input", str(capture)),
        *("--label", "1", "--out", str(tmp_path / "shard")),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "mqttfl: error: 'mqttfl data prepare' needs csiread: install the capture extra: "
        "pip install 'mqttfl[capture]'\n"
    )


def _esp32_csv(path: Path, packets: int, subcarriers: int) -> Path:
    """An ESP32-CSI-Tool capture, as the ESP prints it (no header row)."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(packets):
        values = " ".join(str(v) for v in rng.integers(-60, 60, 2 * subcarriers))
        lines.append(
            "CSI_DATA,STA,aa:bb:cc:dd:ee:ff,-50,11,1,0,0,1,1,0,0,0,0,-90,0,6,0,0,0,0,0,0,0,"
            f"{2 * subcarriers},[{values} ]"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _wait_for_event(
    coordinator: subprocess.Popen[bytes], event: str, root: Path, *, timeout: float
) -> None:
    """Until the coordinator logs ``event`` (its log in ROOT/logs); fail with its output
    at once if it exits first."""

    def seen() -> bool:
        if coordinator.poll() is not None:
            output = (root / "coordinator.out").read_text(errors="replace")
            raise AssertionError(f"coordinator exit {coordinator.returncode}:\n{output[-3000:]}")
        return any(e["event"] == event for e in read_events(root / "logs" / "coordinator.jsonl"))

    wait_for(seen, timeout=timeout, what=f"the coordinator's {event}")


def test_a_coordinator_host_and_a_sensing_device_run_without_torch(
    base: Path, broker: LocalBroker, tmp_path: Path
) -> None:
    """The deployment by role: the base venv's coordinator with two torch clients of this
    checkout; `watch --once` of the base venv on it; the trained client exported with
    torch here; `sense` of the base venv scoring it, publishing, replaying a capture."""
    out, logs = tmp_path / "run", tmp_path / "logs"
    common = ["--config", str(REPO / CONFIG), "--broker", broker.url]
    for item in [*TINY, "rounds=3", "federation.num_clients=2", "data.device=esp32"]:
        common += ["--set", item]
    env = {**_base_env(), "MQTTFL_LOG_DIR": str(logs)}
    with open(tmp_path / "coordinator.out", "wb") as handle:
        coordinator = subprocess.Popen(
            [str(base / "mqttfl"), "coordinator", *common, "--out", str(out)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
    # the clients keep their state where `mqttfl export` looks for it: RUN/clients
    client_args = [*common, "--state-dir", str(out / "clients")]
    clients: list[subprocess.Popen[bytes]] = []
    try:
        _wait_for_event(coordinator, "broker.connected", tmp_path, timeout=60)
        for cid in ("0", "1"):
            with open(tmp_path / f"client-{cid}.out", "wb") as handle:
                clients.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "mqttfl", "client", *client_args, "--id", cid],
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        cwd=REPO,
                        env={**os.environ, "MQTTFL_LOG_DIR": str(logs)},
                        start_new_session=True,
                    )
                )
        _wait_for_event(coordinator, "round.closed", tmp_path, timeout=120)
        watch = _run(base, "watch", "--broker", broker.url, "--run", RUN_ID, "--once", cwd=tmp_path)
        assert watch.returncode == 0, watch.stderr
        assert f"mqttfl watch · run {RUN_ID} · broker connected" in watch.stdout
        assert coordinator.wait(timeout=240) == 0, (tmp_path / "coordinator.out").read_text()
        for client in clients:
            assert client.wait(timeout=60) == 0
    finally:
        for process in (coordinator, *clients):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 3

    export = tmp_path / "export"
    exported = mqttfl(
        "export", str(out), "--client", "0", "--out", str(export), "--with-shard", timeout=600
    )
    assert exported.returncode == 0, exported.stderr[-3000:]

    scored = _run(
        base, "sense", str(export), "--input", f"shard:{export / 'shard'}", "--eval", cwd=tmp_path
    )
    assert scored.returncode == 0, scored.stderr
    rows = {
        line.split()[0]: line.split()[1:] for line in scored.stdout.splitlines() if line.strip()
    }
    assert rows["accuracy"][0] == rows["accuracy"][1], scored.stdout  # run == sense

    windows = load_shard(export / "shard").num_test
    readings = _run(
        base, "sense", str(export), "--input", f"shard:{export / 'shard'}", "--broker", broker.url,
        "--json", "--readings", str(min(3, windows)), cwd=tmp_path,
    )  # fmt: skip
    assert readings.returncode == 0, readings.stderr
    states = [json.loads(line) for line in readings.stdout.splitlines()]
    assert len(states) == min(3, windows)
    assert all(isinstance(state["count"], int) for state in states), states

    # csiread is the [capture] extra: an ESP32 CSV replays with the tolerant parser
    capture = _esp32_csv(tmp_path / "room.csv", 100, 64)
    replay = _run(
        base, "sense", str(export), "--input", str(capture), "--format", "esp32", "--fast",
        "--broker", broker.url, "--json", cwd=tmp_path,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert len(replay.stdout.splitlines()) == 4  # windows of 24 every 24 packets in 100
