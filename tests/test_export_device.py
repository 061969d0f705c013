"""Export where the model lives: on the device, from its state dir and the copy of the
run's manifest its client kept, with no coordinator run directory.

A real ``mqttfl run`` (its clients keep their state in ``RUN/clients``, as a device keeps
it in ``./client-state``) is exported both ways: from the run directory, and as the device
would (``--state-dir DIR --run ID --client N``). The two sensors are the same model (the
same scores from onnxruntime on the client's test windows) and the device's own
evaluation matches the run's last one for that client.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from mqttfl.data.shard import load_shard
from tests.faults import RUN_ID
from tests.helpers import mqttfl
from tests.run_files import finish_a_run, one_line_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finish_a_run(tmp_path_factory.mktemp("device") / "run")


def scores(export: Path, x: np.ndarray) -> np.ndarray:
    """The graph's class scores of ``x``; a graph that adapts its normalization (FedAPA-S,
    the default job's method) is given the same statistics in both exports."""
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {"x": x}
    for given in session.get_inputs():
        if given.name != "x":
            feed[given.name] = np.ones(given.shape, np.float32)
    result: np.ndarray = session.run(None, feed)[0]
    return result


def test_the_device_exports_the_same_sensor_as_the_run_directory(
    finished: Path, tmp_path: Path
) -> None:
    # The device's folder: its state dir as the client left it, nothing of the run dir.
    device = tmp_path / "device" / "client-state"
    shutil.copytree(finished / "clients", device)
    assert (device / RUN_ID / "manifest.json").is_file()
    from_run = mqttfl("export", str(finished), "--client", "1", "--out", str(tmp_path / "a"))
    assert from_run.returncode == 0, from_run.stderr[-3000:]
    on_device = mqttfl(
        "export",
        "--state-dir",
        str(device),
        "--run",
        RUN_ID,
        "--client",
        "1",
        "--out",
        str(tmp_path / "b"),
        "--with-shard",
    )
    assert on_device.returncode == 0, on_device.stderr[-3000:]
    x = load_shard(tmp_path / "b" / "shard").x_test
    np.testing.assert_array_equal(scores(tmp_path / "a", x), scores(tmp_path / "b", x))
    run_spec = json.loads((tmp_path / "a" / "sensor.json").read_text())
    device_spec = json.loads((tmp_path / "b" / "sensor.json").read_text())
    assert device_spec["run"]["round"] == run_spec["run"]["round"]
    assert device_spec["run"]["state_dir"] == str(device.resolve())
    for key in ("accuracy", "f1", "mae", "round", "num_test"):
        assert device_spec["scores"][key] == pytest.approx(run_spec["scores"][key]), key


def test_a_run_directory_without_the_model_says_where_it_lives(
    finished: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "coordinator-host"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("clients", "broker", "logs"))
    result = mqttfl("export", str(copy), "--client", "0", "--out", str(tmp_path / "x"))
    line = one_line_error(result)
    assert f"--state-dir client-state --run {RUN_ID} --client 0" in line, line


def test_a_device_export_without_its_manifest_names_the_file(
    finished: Path, tmp_path: Path
) -> None:
    device = tmp_path / "client-state"
    shutil.copytree(finished / "clients", device)
    (device / RUN_ID / "manifest.json").unlink()
    result = mqttfl(
        "export", "--state-dir", str(device), "--run", RUN_ID, "--client", "0", "--out", "x"
    )
    line = one_line_error(result)
    assert str(device / RUN_ID / "manifest.json") in line, line
