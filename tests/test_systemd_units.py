"""The systemd units a device runs mqttfl as a service with (deploy/systemd/): systemd
accepts them, they keep the policy the README describes, and their command lines are
ones mqttfl takes."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mqttfl.commands.main import build_parser
from tests.helpers import REPO

UNITS = REPO / "deploy" / "systemd"
CLIENT, SENSE = "mqttfl-client@.service", "mqttfl-sense@.service"
INSTALLED = "/opt/mqttfl/bin/mqttfl"  # where the units expect the venv's command
VERIFY = shutil.which("systemd-analyze")


def _settings(name: str) -> dict[str, list[str]]:
    """``key -> values`` of a unit file (a key may be given more than once)."""
    found: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.mark.skipif(VERIFY is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", [CLIENT, SENSE])
def test_systemd_analyze_verifies_the_unit(name: str, tmp_path: Path) -> None:
    """verify checks that ExecStart's program exists: the copy names this venv's."""
    here = Path(sys.executable).with_name("mqttfl")
    assert here.is_file(), here
    text = (UNITS / name).read_text()
    assert INSTALLED in text
    copy = tmp_path / name
    copy.write_text(text.replace(INSTALLED, str(here)))
    assert VERIFY is not None
    result = subprocess.run(
        [VERIFY, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=120
    )
    # verify only warns (exit 0) of an unknown key or a value it cannot parse: any line counts
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize(("name", "identity"), [(CLIENT, "--id"), (SENSE, "--name")])
def test_the_unit_restarts_a_failed_device_as_its_own_user(name: str, identity: str) -> None:
    unit = _settings(name)
    assert unit["Restart"] == ["on-failure"]
    assert re.fullmatch(r"\d+s?", unit["RestartSec"][0])
    assert int(unit["StartLimitBurst"][0]) > 1
    assert int(unit["StartLimitIntervalSec"][0]) > 0
    assert unit["DynamicUser"] == ["yes"]
    assert unit["StateDirectory"][0].endswith("-%i")
    (credentials,) = unit["EnvironmentFile"]
    assert credentials.startswith("/etc/mqttfl/")
    assert credentials.endswith("%i.env")
    assert f"{identity} %i" in unit["ExecStart"][0]


def _expanded(name: str, env: dict[str, str]) -> list[str]:
    """ExecStart as systemd runs it for instance 3 (``kitchen`` for a sensor)."""
    (line,) = _settings(name)["ExecStart"]
    instance = "3" if name == CLIENT else "kitchen"
    line = line.replace("%i", instance).replace("%S", "/var/lib").replace("%L", "/var/log")
    argv = []
    for word in shlex.split(line):
        if word.startswith("$") and not word.startswith("${"):  # split, or gone when unset
            argv += env.get(word[1:], "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return argv


def test_the_client_unit_runs_mqttfl_client_with_its_id_and_state_dir() -> None:
    env = {"MQTTFL_RUN": "fedapa-csi", "MQTTFL_BROKER_URL": "mqtt://broker-host:1883"}
    argv = _expanded(CLIENT, {**env, "MQTTFL_CLIENT_ARGS": "--data /srv/shard"})
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.id, args.run) == ("client", "3", "fedapa-csi")
    assert args.broker == "mqtt://broker-host:1883"
    assert args.state_dir == Path("/var/lib/mqttfl-client-3")
    assert args.data == Path("/srv/shard")
    assert build_parser().parse_args(_expanded(CLIENT, env)[1:]).data is None
    assert _settings(CLIENT)["Environment"] == ["MQTTFL_LOG_DIR=%L/mqttfl-client-%i"]


def test_the_sense_unit_runs_mqttfl_sense_under_its_name() -> None:
    env = {
        "MQTTFL_SENSOR_MODEL": "/opt/mqttfl/sensors/kitchen",
        "MQTTFL_SENSE_INPUT": "mqtt:csi/kitchen",
        "MQTTFL_BROKER_URL": "mqtt://broker-host:1883",
    }
    args = build_parser().parse_args(_expanded(SENSE, env)[1:])
    assert (args.command, args.name, args.input) == ("sense", "kitchen", "mqtt:csi/kitchen")
    assert args.directory == Path("/opt/mqttfl/sensors/kitchen")
