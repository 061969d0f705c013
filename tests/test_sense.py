"""`mqttfl sense` over a real Mosquitto, torch unimportable: gateway frames to readings,
Home Assistant discovery and availability, capture replay, and every kind of bad input
named in one line (malformed frames dropped and counted while sensing goes on)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import onnxruntime as ort
import pytest

from mqttfl.data.shard import load_shard
from mqttfl.provisioning.local_broker import LocalBroker
from tests.helpers import FAST, REPO
from tests.sensing_helpers import NO_TORCH, Recorder, run_and_export, sense, sense_argv

TOPIC = "csi/living-room"
NAME = "living-room"
BASE = f"mqttfl/sensor/{NAME}"
DISCOVERY = f"homeassistant/sensor/{NAME}/people_count/config"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FedAPA on the synthetic rooms, every room on an ESP32 (64 subcarriers): client 0.
    FedAPA's plain export (``x`` in, scores out); FedAPA-S's adaptive one is test_sense_adapt's."""
    out = tmp_path_factory.mktemp("sense")
    overrides = [
        *FAST,
        "method=fedapa",
        "rounds=2",
        "federation.num_clients=2",
        "data.device=esp32",
    ]
    _, export = run_and_export(out, "configs/fedapa-csi.toml", overrides, "0")
    return export


def _frame(amplitudes: np.ndarray) -> bytes:
    """A msgpack frame whose I/Q (imaginary first) has these amplitudes exactly."""
    iq = np.zeros(2 * len(amplitudes), np.float64)
    iq[1::2] = amplitudes
    frame: bytes = msgpack.packb({"csi": iq.tolist(), "t": 1_700_000_000.0})
    return frame


def _scores(export: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(len(x))])


def _start(export: Path, broker: LocalBroker, *extra: str) -> subprocess.Popen[str]:
    argv = sense_argv(
        str(export), "--input", f"mqtt:{TOPIC}", "--broker", broker.url, "--name", NAME, *extra
    )
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def test_gateway_frames_become_readings_published_with_discovery(
    exported: Path, broker: LocalBroker
) -> None:
    shard = load_shard(exported / "shard")
    windows = shard.x_test[:3]
    recorder = Recorder(broker.port)
    process = _start(exported, broker, "--readings", "3", "--json")
    try:
        recorder.wait_for(f"{BASE}/availability", b"online")
        for window in windows:
            for packet in window:
                recorder.publish(TOPIC, _frame(packet))
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        recorder.wait_for(f"{BASE}/availability", b"offline")
        recorder.close()
    assert process.returncode == 0, err
    states = [json.loads(p) for p in recorder.on(f"{BASE}/state")]
    printed = [json.loads(line) for line in out.splitlines()]
    assert states == printed
    assert len(states) == 3
    # the frames carried the shard's windows: the readings are the model's answers on them
    expected = _scores(exported, windows).argmax(axis=1)
    assert [s["count"] for s in states] == [int(k) for k in expected]
    assert all(0.0 < s["confidence"] <= 1.0 for s in states)
    assert states[0]["window_end"] == "2023-11-14T22:13:20.000Z"  # the frames' own time
    config = json.loads(recorder.on(DISCOVERY)[0])
    assert config["state_topic"] == f"{BASE}/state"
    assert config["availability_topic"] == f"{BASE}/availability"
    assert config["value_template"] == "{{ value_json.count }}"
    assert config["unique_id"] == f"mqttfl_{NAME}_people_count"
    assert config["device"]["identifiers"]
    assert config["unit_of_measurement"] == "people"
    # the config and availability are retained: a late subscriber (Home Assistant
    # restarting) gets them at once
    late = Recorder(broker.port)
    try:
        late.wait_for(DISCOVERY)
        late.wait_for(f"{BASE}/availability", b"offline")
        assert all(r for t, _, r in late.messages if t == DISCOVERY)
    finally:
        late.close()


def test_bad_frames_are_dropped_named_and_counted_while_sensing_goes_on(
    exported: Path, broker: LocalBroker
) -> None:
    window = load_shard(exported / "shard").x_test[0]
    recorder = Recorder(broker.port)
    process = _start(exported, broker, "--readings", "1", "--json")
    try:
        recorder.wait_for(f"{BASE}/availability", b"online")
        nan = window[1].astype(np.float64)
        nan[5] = np.nan
        bad = [
            _frame(window[0][:50]),  # 50 subcarriers, the model reads 64
            _frame(nan),
            b"\xc1 not msgpack",
            msgpack.packb({"amplitude": [1.0, 2.0]}),
            b"CSI_DATA,STA,aa:bb,-50,11,1,0,0,1,1,0,0,0,0,-90,0,6,0,0,0,0,0,0,0,4,[1 2 3 4]",
        ]
        for i, packet in enumerate(window):
            if i < len(bad):
                recorder.publish(TOPIC, bad[i])
            recorder.publish(TOPIC, _frame(packet))
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        recorder.close()
    assert process.returncode == 0, err
    assert len(out.splitlines()) == 1  # the window still filled and was read
    assert "50 subcarriers (100 I/Q values), the model reads 64" in err
    assert "NaN or infinite value at I/Q position 11 (subcarrier 5)" in err
    assert "neither an ESP32 CSI line nor msgpack" in err
    assert "a msgpack frame must be a map with a 'csi' entry" in err
    assert "2 subcarriers (4 I/Q values), the model reads 64" in err
    assert "1 readings, 5 frames dropped (malformed 2, nan 1, shape 2)" in err


def test_the_last_will_marks_a_killed_sensor_offline(exported: Path, broker: LocalBroker) -> None:
    recorder = Recorder(broker.port)
    process = _start(exported, broker)
    try:
        recorder.wait_for(f"{BASE}/availability", b"online")
        os.killpg(process.pid, signal.SIGKILL)  # no goodbye: the broker speaks for it
        recorder.wait_for(f"{BASE}/availability", b"offline", timeout=60)
    finally:
        process.kill()
        process.communicate()
        recorder.close()


def _capture(path: Path, packets: int, subcarriers: int, *, duration_ms: float) -> Path:
    rng = np.random.default_rng(0)
    iq = rng.integers(-60, 60, size=(packets, 2 * subcarriers), dtype=np.int8)
    np.savez(path, csi_data=iq, duration_ms=np.float64(duration_ms), chip=np.str_("c3"))
    return path


def test_a_capture_replays_at_its_recorded_rate(
    exported: Path, broker: LocalBroker, tmp_path: Path
) -> None:
    capture = _capture(tmp_path / "room.npz", 100, 64, duration_ms=1000.0)  # 100 packets/s
    started = time.monotonic()
    result = sense(str(exported), "--input", str(capture), "--broker", broker.url, "--once")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert "count=" in result.stdout
    assert elapsed >= 0.23  # the first window's 24 packets take 0.23 s at 100 packets/s
    fast = sense(str(exported), "--input", str(capture), "--broker", broker.url, "--fast")
    assert fast.returncode == 0, fast.stderr
    assert len(fast.stdout.splitlines()) == 4  # windows of 24 every 24 packets in 100


def test_a_capture_with_another_subcarrier_count_is_one_line(
    exported: Path, broker: LocalBroker, tmp_path: Path
) -> None:
    capture = _capture(tmp_path / "ht40.npz", 100, 52, duration_ms=1000.0)
    result = sense(str(exported), "--input", str(capture), "--broker", broker.url)
    assert result.returncode == 2
    assert result.stderr == (
        f"mqttfl: error: {capture}: has 52 subcarriers per packet, but the model was trained "
        "on captures with 64 (sensor.json preprocess.subcarriers.raw_count)\n"
    )


def _edited(exported: Path, tmp_path: Path, edit: dict[str, object]) -> Path:
    copy = tmp_path / "edited"
    copy.mkdir()
    (copy / "model.onnx").write_bytes((exported / "model.onnx").read_bytes())
    spec = json.loads((exported / "sensor.json").read_text())
    for dotted, value in edit.items():
        table = spec
        *parents, key = dotted.split(".")
        for parent in parents:
            table = table[parent]
        table[key] = value
    (copy / "sensor.json").write_text(json.dumps(spec))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"input.shape": [25, 64], "preprocess.window": 25},
            "sensor.json: input.shape is [25, 64], the model takes samples of [24, 64]",
        ),
        (
            {
                "classes": [str(i) for i in range(22)],
                "counts": list(range(22)),
                "output.classes": 22,
            },
            "sensor.json: classes lists 22 classes, the model scores 21",
        ),
        (
            {"input.shape": [24, 63]},
            "sensor.json: input.shape is [24, 63], but preprocess gives samples of [24, 64]",
        ),
        ({"preprocess.window": 0}, "sensor.json: preprocess.window, stride and features must be"),
    ],
)
def test_a_sensor_json_that_does_not_match_the_model_is_one_line(
    exported: Path, tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    copy = _edited(exported, tmp_path, edit)
    result = sense(str(copy), "--input", f"shard:{exported / 'shard'}", "--eval")
    assert result.returncode == 2
    assert result.stderr.startswith(f"mqttfl: error: {copy}/{message}")
    assert result.stderr.count("\n") == 1


def test_a_shard_of_another_client_is_refused(exported: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    from mqttfl.data.shard import Shard, save_shard

    mine = load_shard(exported / "shard")
    save_shard(
        Shard(
            mine.x_train,
            mine.y_train,
            mine.x_test,
            mine.y_test,
            {"normalization": {"mean": [0.0] * 64, "std": [1.0] * 64}},
        ),
        other,
    )
    result = sense(str(exported), "--input", f"shard:{other}", "--eval")
    assert result.returncode == 2
    assert "was prepared with per-feature normalization, sensor.json has none" in result.stderr


def test_on_a_terminal_the_count_is_shown_live(exported: Path, broker: LocalBroker) -> None:
    main, child = pty.openpty()
    argv = sense_argv(
        str(exported), "--input", f"shard:{exported / 'shard'}", "--broker", broker.url
    )
    process = subprocess.Popen(argv, stdout=child, stderr=child, stdin=child, close_fds=True)
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(main)
    assert process.returncode == 0, seen[-2000:]
    text = seen.decode()
    rewrites = [f for f in text.split("\r") if f.startswith("fedapa-csi-client-0: ")]
    windows = load_shard(exported / "shard").num_test
    assert len(rewrites) == windows  # one rewrite of the same line per test window
    assert f"readings {windows}  dropped 0" in rewrites[-1]


def test_sensing_modules_never_import_torch() -> None:
    code = (
        NO_TORCH.split("from mqttfl.commands.main")[0]
        + "import mqttfl.sensing.runner, mqttfl.commands.sense, mqttfl.commands.main\n"
        + "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr


def test_an_unreachable_broker_is_one_line(exported: Path) -> None:
    from mqttfl.provisioning.local_broker import free_port

    url = f"mqtt://127.0.0.1:{free_port()}"  # nobody listens there
    result = sense(str(exported), "--input", f"shard:{exported / 'shard'}", "--broker", url)
    assert result.returncode == 2
    assert result.stderr == f"mqttfl: error: could not connect to {url} within 10s\n"
