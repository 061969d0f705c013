"""`mqttfl sense` as a long-running device service, attacked from inside,
over a real Mosquitto with torch unimportable: frames stamped out of any
clock's range, CSI values finite in float64 but not in float32, a flood of 10,000
frames/s, two names that used to share a client id, a discovery prefix no topic can
hold, a sensor.json nested 100,000 deep; and `offline` on every way out."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from benchmarks.bench_sense_flood import under_flood
from mqttfl.provisioning.local_broker import LocalBroker
from tests.helpers import FAST
from tests.sensing_helpers import Recorder, run_and_export, sense, sense_argv

TOPIC = "csi/hostile"
NAME = "hostile"
WINDOW = 24  # packets per window of the exported model (stride 24)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FedAPA on the synthetic rooms, every room on an ESP32 (64 subcarriers): client 0.
    FedAPA's plain export (``x`` in, scores out); FedAPA-S's adaptive one is test_sense_adapt's."""
    out = tmp_path_factory.mktemp("sense-hostile")
    overrides = [
        *FAST,
        "method=fedapa",
        "rounds=1",
        "federation.num_clients=2",
        "data.device=esp32",
    ]
    _, export = run_and_export(out, "configs/fedapa-csi.toml", overrides, "0")
    return export


@pytest.fixture
def recorder(broker: LocalBroker) -> Iterator[Recorder]:
    watching = Recorder(broker.port)
    yield watching
    watching.close()


def _iq(seed: int) -> list[float]:
    """One ESP packet's I/Q (64 subcarriers), int8 values as numbers."""
    iq: list[float] = np.random.default_rng(seed).integers(-40, 40, 128).astype(float).tolist()
    return iq


def _frame(iq: Sequence[float], t: float | None = None) -> bytes:
    frame: dict[str, Any] = {"csi": list(iq)}
    if t is not None:
        frame["t"] = t
    raw: bytes = msgpack.packb(frame)
    return raw


def _start(
    export: Path, broker: LocalBroker, *extra: str, name: str = NAME, err: Path | None = None
) -> subprocess.Popen[str]:
    argv = sense_argv(
        str(export), "--input", f"mqtt:{TOPIC}", "--broker", broker.url, "--name", name, *extra
    )
    if err is None:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    with open(err, "w") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=handle, text=True, start_new_session=True
        )


def _strict(payload: bytes) -> dict[str, Any]:
    """JSON as the standard has it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in {payload!r}")

    state: dict[str, Any] = json.loads(payload, parse_constant=refuse)
    return state


def _availability(name: str = NAME) -> str:
    return f"mqttfl/sensor/{name}/availability"


def _wait_for_text(path: Path, text: str, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text()[-2000:]}")


# --- row 6: time stamps -----------------------------------------------------------------------
def test_row6_a_frame_stamped_out_of_range_is_read_at_its_received_time(
    exported: Path, broker: LocalBroker, recorder: Recorder
) -> None:
    """Before: `t = 1e12` (or -1e18, 1e300) was a traceback in the time formatting and
    left the availability `online`."""
    process = _start(exported, broker, "--readings", "3", "--json")
    try:
        recorder.wait_for(_availability(), b"online")
        began = time.time()
        for stamp in (1e12, -1e18, 1e300):
            for i in range(WINDOW):
                recorder.publish(TOPIC, _frame(_iq(i), stamp))
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    states = [_strict(p) for p in recorder.on(f"mqttfl/sensor/{NAME}/state")]
    assert len(states) == 3
    for state in states:  # each window ends at the time its last frame was received
        end = datetime.fromisoformat(state["window_end"].replace("Z", "+00:00")).timestamp()
        assert began - 1 <= end <= time.time() + 1, state
    assert "is stamped t=1e+12, not a time near its arrival" in err  # the first few said
    assert "3 readings, 72 frames stamped with their received time" in err
    recorder.wait_for(_availability(), b"offline")


# --- row 7: values finite in float64, not in float32 --------------------------------------------
def test_row7_csi_beyond_float32_is_dropped_and_nothing_non_finite_is_published(
    exported: Path, broker: LocalBroker, recorder: Recorder
) -> None:
    """Before: CSI values of 1e308 published `"confidence":NaN`, which is not JSON."""
    process = _start(exported, broker, "--readings", "1", "--json")
    try:
        recorder.wait_for(_availability(), b"online")
        for i in range(WINDOW):
            if i < 5:
                huge = _iq(i)
                huge[3] = 1e308
                recorder.publish(TOPIC, _frame(huge))
            recorder.publish(TOPIC, _frame(_iq(i)))
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    [state] = [_strict(p) for p in recorder.on(f"mqttfl/sensor/{NAME}/state")]
    assert 0.0 < state["confidence"] <= 1.0
    assert _strict(out.encode()) == state
    assert "I/Q value 1e+308 at position 3 (subcarrier 1) is outside -128..127" in err
    assert err.count("refusing frames") == 1  # five bursts of one frame, within 10 s
    assert "1 readings, 5 frames dropped (range 5)" in err


def _overflowing(exported: Path, tmp_path: Path) -> Path:
    """The export with a normalization whose tiny stds overflow float32: every window's
    input is infinite and the model's scores NaN."""
    copy = tmp_path / "overflowing"
    copy.mkdir()
    (copy / "model.onnx").write_bytes((exported / "model.onnx").read_bytes())
    spec = json.loads((exported / "sensor.json").read_text())
    features = spec["preprocess"]["features"]
    spec["preprocess"]["normalization"] = {"mean": [0.0] * features, "std": [1e-40] * features}
    (copy / "sensor.json").write_text(json.dumps(spec))
    return copy


def test_row7_a_window_whose_scores_are_not_finite_is_skipped_and_counted(
    exported: Path, broker: LocalBroker, recorder: Recorder, tmp_path: Path
) -> None:
    log = tmp_path / "sense.err"
    process = _start(_overflowing(exported, tmp_path), broker, "--json", err=log)
    try:
        recorder.wait_for(_availability(), b"online")
        for _ in range(2):
            for i in range(WINDOW):
                recorder.publish(TOPIC, _frame(_iq(i)))
        _wait_for_text(log, "(2 skipped)")
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    err = log.read_text()
    assert process.returncode == 0, err
    assert out == ""
    assert recorder.on(f"mqttfl/sensor/{NAME}/state") == []
    assert "the model's scores are not finite, nothing published (1 skipped)" in err
    assert "stopped by SIGTERM: 0 readings, 2 windows skipped (scores not finite)" in err
    recorder.wait_for(_availability(), b"offline")


# --- row 8: a flood ---------------------------------------------------------------------------
def test_row8_a_flood_of_frames_keeps_memory_bounded_and_readings_resume(
    exported: Path, broker: LocalBroker
) -> None:
    """Before: 10,000 frames/s for 15 s took RSS 89 -> 531 MB and rising, 2 readings, then
    "could not publish within 30s" and the availability left `online`. Here 5 s of it
    (the benchmark, benchmarks/bench_sense_flood.py, runs 60 s)."""
    result = under_flood(
        exported, broker.port, rate_hz=10_000.0, seconds=5.0, after_s=30.0, settle_s=2.0
    )
    print(json.dumps(result, indent=1))
    assert result["rss_mb"]["peak"] <= 150, result
    assert result["dropped"].get("overflow", 0) > 0, result  # counted, not queued
    assert result["readings"]["during_flood"] + result["readings"]["after_flood"] > 0, result
    assert result["resume"]["fresh_reading_s"] is not None, result  # read again after it
    assert "could not publish" not in result["stderr_tail"]
    assert result["exit"] == {"code": 0, "availability": "offline"}, result


# --- row 9: two names, one client id ----------------------------------------------------------
def test_row9_kitchen_1_and_kitchen_dot_1_are_two_sensors_not_one_session(
    exported: Path, broker: LocalBroker, recorder: Recorder
) -> None:
    """Before: `--name kitchen_1` and `--name kitchen.1` got the same MQTT client id and
    discovery topic: 55 session takeovers each in 22 s, the Home Assistant entity flapping."""
    names = ("kitchen_1", "kitchen.1")
    processes = [_start(exported, broker, name=name) for name in names]
    try:
        for name in names:
            recorder.wait_for(_availability(name), b"online")
        time.sleep(4)  # long enough for takeovers to show (there were 2.5 a second)
        assert [p.poll() for p in processes] == [None, None]
        for process in processes:
            process.send_signal(signal.SIGTERM)
        results = [p.communicate(timeout=60) for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0, 0], results
    configs = {
        name: json.loads(payload)
        for name, node in zip(names, ("kitchen_1", "kitchen_1__296906f4"), strict=True)
        for payload in recorder.on(f"homeassistant/sensor/{node}/people_count/config")
    }
    assert configs["kitchen_1"]["unique_id"] != configs["kitchen.1"]["unique_id"]
    assert configs["kitchen.1"]["state_topic"] == "mqttfl/sensor/kitchen.1/state"
    for name in names:
        assert recorder.on(_availability(name)) == [b"online", b"offline"]  # no flapping
    log = broker.log_path.read_text(errors="replace")
    assert "already connected" not in log, log[-2000:]


# --- row 10: names and prefixes no topic can hold ---------------------------------------------
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--discovery-prefix", "ha/+"),
        ("--discovery-prefix", "h" * 70_000),
        ("--discovery-prefix", "ha\nsensor"),
        ("--name", "n" * 70_000),
        ("--name", "living\nroom"),
        ("--input", "mqtt:" + "c" * 70_000),
    ],
    ids=["wildcard", "70000-prefix", "newline-prefix", "70000-name", "newline-name", "topic"],
)
def test_row10_a_name_or_prefix_no_topic_can_hold_is_one_line(
    exported: Path, option: str, value: str
) -> None:
    """Before: `--discovery-prefix 'ha/+'` or 70,000 characters was a paho ValueError
    traceback."""
    argv = {"--input": f"mqtt:{TOPIC}", "--name": "kitchen", "--discovery-prefix": "homeassistant"}
    argv[option] = value
    flat = [item for pair in argv.items() for item in pair]
    result = sense(str(exported), *flat, "--broker", "mqtt://127.0.0.1:1")
    assert result.returncode == 2, result.stderr[-500:]
    assert result.stderr.startswith(f"mqttfl: error: {option} ")
    assert result.stderr.count("\n") == 1
    assert len(result.stderr) < 300


# --- row 11: a sensor.json nested 100,000 deep ------------------------------------------------
def test_row11_a_sensor_json_nested_100000_deep_is_one_line_naming_it(
    exported: Path, tmp_path: Path
) -> None:
    """Before: a RecursionError traceback."""
    copy = tmp_path / "deep"
    copy.mkdir()
    (copy / "sensor.json").write_text("[" * 100_000 + "]" * 100_000)
    result = sense(str(copy), "--input", f"shard:{exported / 'shard'}", "--eval")
    assert result.returncode == 2, result.stderr[-500:]
    assert result.stderr == (
        f"mqttfl: error: {copy}/sensor.json: unreadable JSON: nested too deeply\n"
    )


def test_row11_a_deep_value_in_what_the_sensor_only_shows_is_left_out(
    exported: Path, tmp_path: Path
) -> None:
    """``run`` and ``scores`` are shown, never computed with: a nested value there (deep
    enough to break its own formatting) is left out and the sensor works."""
    copy = tmp_path / "deep-run"
    copy.mkdir()
    (copy / "model.onnx").write_bytes((exported / "model.onnx").read_bytes())
    spec = json.loads((exported / "sensor.json").read_text())
    text = json.dumps(spec).replace('"arch": "middle"', '"arch": ' + "[" * 950 + "]" * 950)
    assert "[[[" in text
    (copy / "sensor.json").write_text(text)
    result = sense(str(copy), "--input", f"shard:{exported / 'shard'}", "--eval")
    assert result.returncode == 0, result.stderr[-500:]
    assert "windows; run: round 1 of metrics.jsonl" in result.stdout


# --- offline on every way out -----------------------------------------------------------------
def test_sigint_and_the_end_of_the_input_leave_the_sensor_offline(
    exported: Path, broker: LocalBroker, recorder: Recorder
) -> None:
    process = _start(exported, broker)
    try:
        recorder.wait_for(_availability(), b"online")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "mqttfl sense: stopped by SIGINT: 0 readings" in err
    recorder.wait_for(_availability(), b"offline")

    shard = sense(str(exported), "--input", f"shard:{exported / 'shard'}", "--broker", broker.url)
    assert shard.returncode == 0, shard.stderr
    name = json.loads((exported / "sensor.json").read_text())["run"]["run_id"] + "-client-0"
    assert recorder.on(_availability(name))[-1] == b"offline"


def test_an_error_while_sensing_leaves_the_sensor_offline(
    exported: Path, broker: LocalBroker, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after connecting (here one put in its way) ends with `offline`, then the
    error's line, as the connection's clean close sends no last will."""
    import asyncio
    import io

    from mqttfl.bus.address import BrokerAddress
    from mqttfl.errors import DataError
    from mqttfl.sensing.runner import SenseOptions, Sensor
    from mqttfl.sensing.source import parse_source

    async def broken(self: Sensor) -> None:
        recorder.wait_for(_availability(), b"online")
        raise DataError("frames", "something the sensor cannot go on from")

    monkeypatch.setattr(Sensor, "_sense", broken)
    options = SenseOptions(
        exported, parse_source(f"mqtt:{TOPIC}"), BrokerAddress.parse(broker.url), name=NAME
    )
    with pytest.raises(DataError, match="cannot go on"):
        asyncio.run(Sensor(options, out=io.StringIO(), err=io.StringIO()).run())
    recorder.wait_for(_availability(), b"offline")
