"""A sensing device's own identity on a broker from `mqttfl broker init --sensors`.

One broker made by the real command line (2 clients of a run, the sensors ``kitchen`` and
``hall``, one more watcher), its Mosquitto, and `mqttfl sense` of an exported client,
torch unimportable, with nothing but a credentials file's variables in its environment:
its gateway's frames become readings that a watcher reads; what the ACL refuses a sensor,
and every refusal `sense` meets, is one line naming the sensor's way out.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest

from mqttfl.bus.address import Credentials
from mqttfl.data.shard import load_shard
from mqttfl.provisioning.broker_init import BrokerSetup, read_env_file
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.sensing.identity import frames_note, refusal_hint, sensor_credentials
from mqttfl.wire.sensors import SensorTopics
from tests.helpers import FAST, REPO, mqttfl
from tests.sensing_helpers import Recorder, run_and_export, sense_argv

RUN = "sensor-id"
KITCHEN = SensorTopics("kitchen")
HALL = SensorTopics("hall")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FedAPA on the synthetic rooms, every room on an ESP32 (64 subcarriers): client 0.
    FedAPA's plain export (``x`` in, scores out); FedAPA-S's adaptive one is test_sense_adapt's."""
    out = tmp_path_factory.mktemp("sensor-identity")
    overrides = [
        *FAST,
        "method=fedapa",
        "rounds=2",
        "federation.num_clients=2",
        "data.device=esp32",
    ]
    _, export = run_and_export(out, "configs/fedapa-csi.toml", overrides, "0")
    return export


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> BrokerSetup:
    out = tmp_path_factory.mktemp("locked") / "broker"
    port = free_port()
    result = mqttfl(
        "broker", "init", "--clients", "2", "--run-id", RUN, "--sensors", "kitchen,hall",
        "--watchers", "ha", "--port", str(port), "--out", str(out), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "sensor: set -a; . ./sensor-<name>.env; set +a; mqttfl sense" in result.stdout
    names = ["coordinator", "watch", "watch-ha", "0", "1"]
    names += [f"{role}-{n}" for n in ("kitchen", "hall") for role in ("sensor", "gateway")]
    passwords = {
        name: read_env_file(out / "credentials" / f"{name}.env")["MQTTFL_BROKER__PASSWORD"]
        for name in names
    }
    return BrokerSetup(out, port, False, passwords)


@pytest.fixture(scope="module")
def locked(setup: BrokerSetup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with LocalBroker(
        tmp_path_factory.mktemp("run"), port=setup.port, conf=setup.conf.read_text()
    ) as running:
        yield running


def _sense(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`mqttfl sense ARGS` with only these MQTTFL_BROKER__* variables of the caller's."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQTTFL_BROKER__")}
    return subprocess.run(
        sense_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**clean, **env},
    )


def _pub(setup: BrokerSetup, user: str, topic: str, message: str = "forged") -> str:
    """mosquitto_pub at QoS 1 over MQTT 5 as ``user``: what it printed (a PUBACK's refusal
    says "not authorized")."""
    result = subprocess.run(
        [
            "mosquitto_pub", "-h", "127.0.0.1", "-p", str(setup.port), "-u", user,
            "-P", setup.passwords[user], "-q", "1", "-V", "mqttv5", "-t", topic, "-m", message,
        ],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    return (result.stdout + result.stderr).lower()


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("mqttfl: error: "), result.stderr[-2000:]
    return lines[0]


def _frame(amplitudes: np.ndarray) -> bytes:
    iq = np.zeros(2 * len(amplitudes), np.float64)
    iq[1::2] = amplitudes
    frame: bytes = msgpack.packb({"csi": iq.tolist(), "t": 1_700_000_000.0})
    return frame


def test_the_acl_gives_a_sensor_its_readings_and_its_gateway_frames_only(
    setup: BrokerSetup,
) -> None:
    acl = (setup.out / "acl").read_text()
    assert (
        "user sensor-kitchen\n"
        "topic write mqttfl/sensor/kitchen/state\n"
        "topic write mqttfl/sensor/kitchen/availability\n"
        "topic write homeassistant/sensor/kitchen/people_count/config\n"
        "topic read csi/kitchen\n\n"
        "user gateway-kitchen\n"
        "topic write csi/kitchen\n"
    ) in acl
    for watcher in ("watch", "watch-ha"):  # every watcher reads the run and the sensors
        assert (
            f"user {watcher}\ntopic read mqttfl/{RUN}/#\ntopic read mqttfl/sensor/#\n"
            "topic read homeassistant/sensor/#\n\n"
        ) in acl
    for name in ("sensor-kitchen", "gateway-kitchen"):
        env_file = setup.env_file(name)
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert read_env_file(env_file)["MQTTFL_BROKER__USERNAME"] == name
    passwd = (setup.out / "passwd").read_text()
    assert {line.split(":")[0] for line in passwd.splitlines()} == set(setup.passwords)


def test_broker_init_names_a_bad_sensor_name_in_one_line(tmp_path: Path) -> None:
    bad = mqttfl(
        "broker", "init", "--clients", "1", "--sensors", "kitchen,living/room",
        "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert _one_error(bad) == (
        "mqttfl: error: --sensors: sensor name 'living/room': use 1-64 letters, digits, "
        "'_', '.' or '-' (it goes into topics)"
    )
    twice = mqttfl(
        "broker", "init", "--ids", "sensor-kitchen", "--sensors", "kitchen",
        "--out", str(tmp_path / "c"),
    )  # fmt: skip
    assert "identity 'sensor-kitchen' would be made twice" in _one_error(twice)
    assert not (tmp_path / "c" / "passwd").exists()


def test_sense_with_its_identity_reads_its_gateway_and_publishes_readings(
    exported: Path, setup: BrokerSetup, locked: LocalBroker
) -> None:
    windows = load_shard(exported / "shard").x_test[:2]
    watcher = Recorder(locked.port, setup.env("watch-ha"))
    gateway = Recorder(locked.port, setup.env("gateway-kitchen"))
    argv = sense_argv(
        str(exported), "--input", f"mqtt:{KITCHEN.frames}", "--broker", locked.url,
        "--name", "kitchen", "--readings", "2", "--json",
    )  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQTTFL_BROKER__")}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**clean, **setup.env("sensor-kitchen")}, start_new_session=True,
    )  # fmt: skip
    try:
        watcher.wait_for(KITCHEN.availability, b"online")
        for window in windows:
            for packet in window:
                gateway.publish(KITCHEN.frames, _frame(packet))
        out, err = process.communicate(timeout=60)
        watcher.wait_for(KITCHEN.availability, b"offline")
    finally:
        process.kill()
        gateway.close()
        watcher.close()
    assert process.returncode == 0, err
    states = [json.loads(p) for p in watcher.on(KITCHEN.state)]
    assert len(states) == 2
    assert states == [json.loads(line) for line in out.splitlines()]
    config = json.loads(watcher.on(KITCHEN.discovery)[0])
    assert config["state_topic"] == KITCHEN.state
    assert config["availability_topic"] == KITCHEN.availability
    # the watcher reads the sensors, never the gateway's raw frames
    assert not watcher.on(KITCHEN.frames)


def test_a_sensor_identity_cannot_publish_on_a_run_or_another_sensors_topics(
    setup: BrokerSetup, locked: LocalBroker
) -> None:
    watcher = Recorder(locked.port, setup.env("watch"))
    try:
        forged = [
            f"mqttfl/{RUN}/round/1/up/0",
            f"mqttfl/{RUN}/round/1/start",
            f"mqttfl/{RUN}/status/0",
            f"mqttfl/{RUN}/state",
            f"mqttfl/{RUN}/lease",
            HALL.state,
            HALL.availability,
            HALL.discovery,
            HALL.frames,
            KITCHEN.frames,  # its gateway's to write, not its own
        ]
        for topic in forged:
            assert "not authorized" in _pub(setup, "sensor-kitchen", topic), topic
        for topic in (KITCHEN.state, HALL.frames, f"mqttfl/{RUN}/status/0"):
            assert "not authorized" in _pub(setup, "gateway-kitchen", topic), topic
        assert "not authorized" not in _pub(setup, "sensor-kitchen", KITCHEN.state, "own")
        watcher.wait_for(KITCHEN.state, b"own")
    finally:
        watcher.close()
    assert all(payload != b"forged" for _, payload, _ in watcher.messages), watcher.messages


def test_sense_refused_by_the_acl_says_what_the_sensor_identity_may_do(
    exported: Path, setup: BrokerSetup, locked: LocalBroker
) -> None:
    shard = f"shard:{exported / 'shard'}"
    kitchen = setup.env("sensor-kitchen")
    as_hall = _sense(kitchen, str(exported), "--input", shard, "--broker", locked.url,
                     "--name", "hall", "--readings", "1")  # fmt: skip
    line = _one_error(as_hall)
    assert "sensor 'hall' (user 'sensor-kitchen') may not publish to mqttfl/sensor/hall/" in line
    assert "not authorized (MQTT reason code 135)" in line
    assert line.endswith(
        "the sensor identity 'kitchen' may publish only under mqttfl/sensor/kitchen/ and "
        "homeassistant/sensor/kitchen/people_count/config: start sense with --name kitchen"
    )
    assert "--id" not in line
    prefix = _sense(kitchen, str(exported), "--input", shard, "--broker", locked.url,
                    "--name", "kitchen", "--discovery-prefix", "ha", "--readings", "1")  # fmt: skip
    assert _one_error(prefix).endswith("start sense without --discovery-prefix")
    client = _sense(setup.env("0"), str(exported), "--input", shard, "--broker", locked.url,
                    "--name", "kitchen", "--readings", "1")  # fmt: skip
    assert "user '0' is not a sensor identity: a sensing device logs in with the " in (
        _one_error(client)
    )
    # with its own identity and name it publishes
    good = _sense(kitchen, str(exported), "--input", shard, "--broker", locked.url,
                  "--name", "kitchen", "--readings", "1", "--json")  # fmt: skip
    assert good.returncode == 0, good.stderr


def test_sense_with_wrong_or_no_credentials_exits_2_with_one_line(
    exported: Path, setup: BrokerSetup, locked: LocalBroker
) -> None:
    shard = f"shard:{exported / 'shard'}"
    wrong = {**setup.env("sensor-kitchen"), "MQTTFL_BROKER__PASSWORD": "guess"}
    line = _one_error(
        _sense(wrong, str(exported), "--input", shard, "--broker", locked.url, "--name", "kitchen")
    )
    assert line.startswith(f"mqttfl: error: the broker {locked.url} refused user 'sensor-kitchen'")
    assert "MQTTFL_BROKER__USERNAME" in line
    assert "`set -a; . ./sensor-kitchen.env; set +a`" in line
    assert "`mqttfl broker init --sensors kitchen`" in line
    anonymous = _one_error(
        _sense({}, str(exported), "--input", shard, "--broker", locked.url, "--name", "kitchen")
    )
    assert "refused an anonymous login (no user name)" in anonymous
    assert "sensor-kitchen.env" in anonymous


def test_the_sensor_lines_name_the_way_out() -> None:
    creds = sensor_credentials(Credentials("sensor-hall", "p"), HALL)
    assert (creds.username, creds.password) == ("sensor-hall", "p")
    assert "credentials/sensor-hall.env" in creds.origin
    assert refusal_hint(None, HALL).startswith("an anonymous login is not a sensor identity")
    dotted = refusal_hint("sensor-hall.1", HALL)
    assert "homeassistant/sensor/hall_1__" in dotted
    assert dotted.endswith("--name hall.1")
    assert frames_note("sensor-hall", HALL, "csi/hall") is None
    assert frames_note("0", HALL, "csi/other") is None  # not a sensor identity: no ACL known
    note = frames_note("sensor-hall", HALL, "csi/other")
    assert note is not None
    assert "may read only csi/hall" in note
