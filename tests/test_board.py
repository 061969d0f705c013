"""The board test: one client of a real federation runs inside a memory cgroup
pinned to one CPU, the budget of a 512 MB board (768 MB for the tiny model on the
default job's 242 subcarriers), and trains and uploads every round without an OOM kill.
With the large model it then exports its model on the same board, as a device does
(``mqttfl export --state-dir``), and the sensor checks out against torch.

The other client and the coordinator run outside the board; the broker is a real
Mosquitto. Training keeps the config's batch size: only evaluation passes are batched
to bound their activations (:mod:`mqttfl.training.memory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.testing.board import Board, unavailable
from tests._shared_data import require_shared
from tests.helpers import REPO, spawn

MB = 2**20
ROUNDS = 2
DEFAULT_JOB = "configs/fedapa-csi.toml"
ESPECTRE = "configs/presence-espectre.toml"

# (config, model, board MB, method: None for the config's own)
CASES = [
    pytest.param(DEFAULT_JOB, "middle", 512, None, id="default-middle-512MB"),
    pytest.param(DEFAULT_JOB, "large", 512, None, id="default-large-512MB"),
    pytest.param(DEFAULT_JOB, "tiny", 768, None, id="default-tiny-768MB"),
    # FedAPA-S adapts to each scored day: its gate's passes must fit the board as training does
    pytest.param(DEFAULT_JOB, "middle", 512, "fedapa-session", id="fedapa-s-middle-512MB"),
    pytest.param(DEFAULT_JOB, "large", 512, "fedapa-session", id="fedapa-s-large-512MB"),
    pytest.param(
        ESPECTRE, "tiny", 512, None, id="espectre-tiny-512MB", marks=pytest.mark.shared_data
    ),
    pytest.param(
        ESPECTRE, "middle", 512, None, id="espectre-middle-512MB", marks=pytest.mark.shared_data
    ),
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"no board here: {unavailable()}"),
]


def _events(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("config", "model", "limit_mb", "method"), CASES)
def test_a_client_trains_every_round_on_the_board(
    config: str, model: str, limit_mb: int, method: str | None, broker: LocalBroker, tmp_path: Path
) -> None:
    overrides = [
        f"rounds={ROUNDS}",
        "federation.num_clients=2",
        "federation.min_clients=2",
        f"model.name={model}",
    ]
    if method is not None:
        overrides.append(f"method={method}")
    if config == ESPECTRE:
        overrides.append(f"data.path={require_shared('espectre').parent}")
    common = ["--config", config, "--broker", broker.url]
    for item in overrides:
        common += ["--set", item]
    logs = tmp_path / "logs"
    env = {"MQTTFL_LOG_DIR": str(logs)}
    out = tmp_path / "run"
    coordinator = spawn("coordinator", *common, "--out", str(out), log=tmp_path / "c.out", env=env)
    state = ["--state-dir", str(tmp_path / "state")]
    other = spawn("client", *common, "--id", "1", *state, log=tmp_path / "1.out", env=env)
    with Board(limit_mb * MB, cpus="0") as board:
        argv = [sys.executable, "-m", "mqttfl", "client", *common, "--id", "0", *state]
        with open(tmp_path / "0.out", "wb") as handle:
            device = subprocess.Popen(
                board.command(argv),
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **env},
                start_new_session=True,
            )
        try:
            device_code = device.wait(timeout=420)
            coordinator_code = coordinator.wait(timeout=120)
            other.wait(timeout=60)
        finally:
            for proc in (device, coordinator, other):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        kills, peak = board.oom_kills(), board.peak_bytes()

    output = (tmp_path / "0.out").read_text(errors="replace")[-2000:]
    assert kills == 0, f"the OOM killer ended the client ({limit_mb} MB board):\n{output}"
    assert device_code == 0, f"client exit {device_code}:\n{output}"
    assert coordinator_code == 0, (tmp_path / "c.out").read_text()[-2000:]
    events = _events(logs / "client-0.jsonl")
    uploaded = sorted(int(str(e["round"])) for e in events if e["event"] == "upload.sent")
    evaluated = sorted(int(str(e["round"])) for e in events if e["event"] == "round.evaluated")
    assert uploaded == list(range(1, ROUNDS + 1)), uploaded
    assert evaluated == list(range(1, ROUNDS + 1)), evaluated
    rss_peak = max(float(str(e["peak_rss_mb"])) for e in events if "peak_rss_mb" in e)
    assert 0 < rss_peak < limit_mb
    sys.stderr.write(
        f"board {limit_mb} MB, {Path(config).stem} {model} {method or ''}: "
        f"process peak {rss_peak:.0f} MB, "
        f"cgroup peak {peak / MB:.0f} MB\n"
    )
    if model == "large":
        _export_on_the_board(config, limit_mb, tmp_path)


def _export_on_the_board(config: str, limit_mb: int, tmp_path: Path) -> None:
    """The device's own export (its state dir, the run's manifest its client kept) in the
    same memory and CPU: the trace, onnxruntime's check against torch, and for FedAPA-S
    the adaptive graph's checks."""
    run_id = tomllib.loads((REPO / config).read_text())["run_id"]
    out = tmp_path / "sensor"
    with Board(limit_mb * MB, cpus="0") as board:
        argv = [sys.executable, "-m", "mqttfl", "export", "--state-dir", str(tmp_path / "state")]
        argv += ["--run", run_id, "--client", "0", "--out", str(out)]
        done = subprocess.run(
            board.command(argv), capture_output=True, text=True, cwd=REPO, timeout=300
        )
        kills, peak = board.oom_kills(), board.peak_bytes()
    assert kills == 0, f"the OOM killer ended the export ({limit_mb} MB board):\n{done.stderr}"
    assert done.returncode == 0, done.stderr[-2000:]
    checks = json.loads((out / "sensor.json").read_text())["export"]
    assert checks["max_abs_diff_vs_torch"] <= 1e-4
    assert checks.get("transductive_agreement_vs_torch", 1.0) == 1.0
    sys.stderr.write(f"board {limit_mb} MB, export: cgroup peak {peak / MB:.0f} MB\n")
