"""Bad command lines: one `mqttfl: error: ...` line on stderr, exit 2, no traceback."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from mqttfl.bus.refusal import Refused
from mqttfl.commands import common
from mqttfl.commands import main as cli
from mqttfl.commands import models as models_command
from mqttfl.errors import BrokerError, ConfigError, MqttflError, first_mqttfl_error
from tests.helpers import mqttfl

CONFIG = "configs/fedapa-csi.toml"


def assert_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("mqttfl: error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A directory that cannot be created, even by root: a regular file is in the way."""
    (tmp_path / "file").write_text("not a directory\n")
    return tmp_path / "file" / "sub"


BAD_URLS = [
    ("mqtt://[::1", "malformed URL"),
    ("ftp://x", "scheme must be mqtt or mqtts"),
    ("mqtt://127.0.0.1:99999", "port '99999' is not a number in 1-65535"),
    ("mqtt://127.0.0.1:0", "port 0 is not in 1-65535"),
    ("mqtt://no-such-host.invalid:1883", "cannot resolve host 'no-such-host.invalid'"),
]


@pytest.mark.parametrize(("url", "reason"), BAD_URLS)
def test_bad_broker_url_names_it(url: str, reason: str) -> None:
    with pytest.raises(MqttflError, match=reason) as info:
        common.broker_url(url)
    assert f"--broker {url!r}" in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("localhost", "mqtt://localhost:1883"),
        ("mqtts://127.0.0.1", "mqtts://127.0.0.1:8883"),
        ("mqtt://[::1]:1884", "mqtt://[::1]:1884"),
    ],
)
def test_good_broker_url_is_normalised(url: str, expected: str) -> None:
    assert common.broker_url(url) == expected


@pytest.mark.parametrize(("url", "reason"), BAD_URLS)
def test_coordinator_with_bad_broker_url(tmp_path: Path, url: str, reason: str) -> None:
    out = tmp_path / "run"
    result = mqttfl("coordinator", "--config", CONFIG, "--broker", url, "--out", str(out))
    assert_one_line(result, url, reason)
    assert not out.exists()


def test_client_with_port_out_of_range() -> None:
    result = mqttfl("client", "--config", CONFIG, "--id", "0", "--broker", "mqtt://127.0.0.1:99999")
    assert_one_line(result, "99999")


def test_run_checks_the_broker_url_once_before_starting_anything(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = mqttfl("run", CONFIG, "--broker", "mqtt://[::1", "--out", str(out), timeout=60)
    assert_one_line(result, "mqtt://[::1")
    assert not out.exists()


def test_run_with_unknown_model_fails_at_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = mqttfl("run", CONFIG, "--set", "model.name=bogus", "--out", str(out), timeout=60)
    assert_one_line(result, "config key 'model.name': unknown model 'bogus'; known: tiny")
    assert not out.exists()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["method=fedali"], "config key 'model.name'"),
        (["method=fedali", 'model.per_client=["transformer", "tiny"]'], "model.per_client"),
    ],
)
def test_run_refuses_a_model_the_method_cannot_train_before_starting_anything(
    tmp_path: Path, overrides: list[str], key: str
) -> None:
    out = tmp_path / "run"
    sets = [a for o in overrides for a in ("--set", o)]
    result = mqttfl("run", CONFIG, *sets, "--out", str(out), timeout=60)
    assert_one_line(result, key, "fedali needs model 'transformer'")
    assert not out.exists()  # no broker, no client was started


def test_unwritable_out_for_run(blocked: Path) -> None:
    assert_one_line(mqttfl("run", CONFIG, "--out", str(blocked), timeout=60), str(blocked))


def test_unwritable_out_for_coordinator(blocked: Path) -> None:
    result = mqttfl(
        "coordinator",
        "--config",
        CONFIG,
        "--broker",
        "mqtt://127.0.0.1:1883",
        "--out",
        str(blocked),
    )
    assert_one_line(result, str(blocked), "is not a directory")


def test_unwritable_out_for_data_prepare(tmp_path: Path, blocked: Path) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("t,a,b\n" + "".join(f"{i},{i},{i}\n" for i in range(40)))
    result = mqttfl(
        "data",
        "prepare",
        "--format",
        "csv",
        "--input",
        str(csv),
        "--label",
        "walk",
        "--out",
        str(blocked),
        "--window",
        "10",
    )
    assert_one_line(result, str(blocked), "is not a directory")


def test_unwritable_out_for_broker_init(blocked: Path) -> None:
    result = mqttfl("broker", "init", "--clients", "2", "--out", str(blocked))
    assert_one_line(result, str(blocked), "is not a directory")


@pytest.mark.parametrize("port", ["0", "65536"])
def test_broker_init_port_out_of_range(tmp_path: Path, port: str) -> None:
    out = tmp_path / "broker"
    result = mqttfl("broker", "init", "--clients", "2", "--port", port, "--out", str(out))
    assert_one_line(result, f"--port {port}", "1-65535")
    assert not out.exists()


def test_broker_init_refuses_names_for_a_numbered_data_source(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    result = mqttfl("broker", "init", "--ids", "a,b,c", "--config", CONFIG, "--out", str(out))
    assert_one_line(result, "client id 'a' is not a number", "'synthetic'", CONFIG)
    assert not out.exists()


def test_broker_init_without_config_accepts_names_and_says_what_they_need(
    tmp_path: Path,
) -> None:
    result = mqttfl("broker", "init", "--ids", "a,b", "--out", str(tmp_path / "broker"))
    assert result.returncode == 0, result.stderr
    assert "note: ids a, b are not numbers" in result.stdout
    assert "'shards'" in result.stdout


def test_broker_init_refuses_ids_beyond_espectre_chips(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    config = "configs/presence-espectre.toml"
    result = mqttfl("broker", "init", "--clients", "6", "--config", config, "--out", str(out))
    assert_one_line(result, "client id '5'", "ESPectre has 5 clients")


def test_first_mqttfl_error_is_found_in_nested_groups() -> None:
    inner = ConfigError("model.name", "unknown model 'x'")
    group = ExceptionGroup(
        "outer", [ValueError("noise"), ExceptionGroup("inner", [KeyError("k"), inner])]
    )
    assert first_mqttfl_error(group) is inner
    assert first_mqttfl_error(inner) is inner
    assert first_mqttfl_error(ExceptionGroup("none", [ValueError("v")])) is None


def test_a_refusal_is_named_over_what_it_caused() -> None:
    stopped = BrokerError("could not publish to t: the bus has stopped")
    refused = Refused("the broker refused user 'x': not authorized")
    group = ExceptionGroup("outer", [stopped, ExceptionGroup("inner", [refused])])
    assert first_mqttfl_error(group) is stopped
    assert first_mqttfl_error(group, prefer=Refused) is refused


def _fail_in_task_group(error: BaseException) -> None:
    async def fail() -> None:
        raise error

    async def main() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail())
            group.create_task(asyncio.sleep(10))

    asyncio.run(main())


def test_main_unwraps_a_task_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def cmd(args: object) -> int:
        _fail_in_task_group(MqttflError("broker unreachable: mqtt://127.0.0.1:1"))
        return 0

    monkeypatch.setattr(models_command, "cmd_models", cmd)
    assert cli.main(["models"]) == 2
    assert capsys.readouterr().err == "mqttfl: error: broker unreachable: mqtt://127.0.0.1:1\n"


def test_main_reraises_a_group_without_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        models_command, "cmd_models", lambda args: _fail_in_task_group(RuntimeError("bug"))
    )
    with pytest.raises(ExceptionGroup) as info:
        cli.main(["models"])
    assert isinstance(info.value.exceptions[0], RuntimeError)


@pytest.mark.parametrize("role", ["coordinator", "client"])
def test_an_unreachable_broker_fails_within_connect_timeout_with_one_line(
    tmp_path: Path, role: str
) -> None:
    extra = ["--out", str(tmp_path / "out")] if role == "coordinator" else ["--id", "0"]
    result = mqttfl(
        role,
        "--config",
        CONFIG,
        "--broker",
        "mqtt://127.0.0.1:1",
        "--set",
        "broker.connect_timeout_s=2",
        *extra,
        timeout=60,
        env={"MQTTFL_LOG_DIR": str(tmp_path / "logs")},  # not the repo's logs/
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "mqttfl: error: could not connect to mqtt://127.0.0.1:1 within 2s"
    )
