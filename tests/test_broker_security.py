"""`mqttfl broker init` and what the broker then enforces, shown with mosquitto_pub/_sub.

One TLS broker per module (auth + ACL + packet limit), as `broker init --tls` writes it;
every check is an action by the real mosquitto command-line clients, and a legitimate
federation completes under the same rules with credentials from the environment only.
"""

from __future__ import annotations

import json
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttfl.config import load_config
from mqttfl.errors import ConfigError, MqttflError
from mqttfl.provisioning.broker_init import BrokerSetup, client_ids, init_broker, read_env_file
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.wire.control import RunStatus
from tests.faults import RUN_ID, Federation
from tests.helpers import mqttfl

BASE = f"mqttfl/{RUN_ID}"
MAX_PACKET = 1_000_000


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> BrokerSetup:
    out = tmp_path_factory.mktemp("secure") / "broker"
    port = free_port()
    result = mqttfl(
        "broker",
        "init",
        "--clients",
        "2",
        "--out",
        str(out),
        "--tls",
        "--run-id",
        RUN_ID,
        "--port",
        str(port),
        "--max-packet-bytes",
        str(MAX_PACKET),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    passwords = {
        name: read_env_file(out / "credentials" / f"{name}.env")["MQTTFL_BROKER__PASSWORD"]
        for name in ("coordinator", "watch", "0", "1")
    }
    return BrokerSetup(out, port, True, passwords)


@pytest.fixture(scope="module")
def secure_broker(
    setup: BrokerSetup, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalBroker]:
    conf = setup.conf.read_text()
    with LocalBroker(tmp_path_factory.mktemp("run"), port=setup.port, conf=conf) as running:
        yield running


def _tls(setup: BrokerSetup) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(setup.port), "--cafile", str(setup.ca)]


def _as(setup: BrokerSetup, user: str | None, password: str | None = None) -> list[str]:
    if user is None:
        return _tls(setup)
    return [
        *_tls(setup),
        "-u",
        user,
        "-P",
        password if password is not None else setup.passwords[user],
    ]


def pub(
    setup: BrokerSetup,
    user: str | None,
    topic: str,
    message: str = "x",
    *,
    password: str | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "mosquitto_pub",
            *_as(setup, user, password),
            "-q",
            "1",
            "-t",
            topic,
            "-m",
            message,
            "-V",
            "mqttv5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )


class Sub:
    """A mosquitto_sub in the background; ``lines()`` is what it received (topic payload)."""

    def __init__(self, setup: BrokerSetup, user: str, topics: list[str], out: Path) -> None:
        self.out = out
        args = [
            "stdbuf",
            "-oL",
            "mosquitto_sub",
            *_as(setup, user),
            "-q",
            "1",
            "-v",
            "-d",
            "-V",
            "mqttv5",
        ]
        for topic in topics:
            args += ["-t", topic]
        with open(out, "w") as handle:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while "SUBACK" not in self.text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"mosquitto_sub did not subscribe: {self.text()}")
            time.sleep(0.05)

    def text(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def lines(self) -> list[str]:
        return [line for line in self.text().splitlines() if line.startswith(BASE)]

    def wait_for(self, line: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f"{line!r} never arrived: {self.text()[-2000:]}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


def test_init_writes_conf_hashed_passwords_acl_and_tls(setup: BrokerSetup) -> None:
    conf = setup.conf.read_text()
    assert "allow_anonymous false" in conf
    assert f"password_file {setup.out / 'passwd'}" in conf
    assert f"acl_file {setup.out / 'acl'}" in conf
    assert f"listener {setup.port} 127.0.0.1" in conf
    assert f"max_packet_size {MAX_PACKET}" in conf
    assert f"certfile {setup.out / 'tls' / 'server.crt'}" in conf
    passwd = (setup.out / "passwd").read_text()
    assert sorted(line.split(":")[0] for line in passwd.splitlines()) == [
        "0",
        "1",
        "coordinator",
        "watch",
    ]
    assert all(pw not in passwd for pw in setup.passwords.values())  # salted hashes only
    for private in (
        "passwd",
        "acl",
        "credentials/0.env",
        "credentials/coordinator.env",
        "tls/ca.key",
        "tls/server.key",
    ):
        assert stat.S_IMODE((setup.out / private).stat().st_mode) == 0o600, private
    acl = (setup.out / "acl").read_text()
    assert f"user coordinator\ntopic readwrite {BASE}/state\ntopic readwrite {BASE}/lease\n" in acl
    assert f"user watch\ntopic read {BASE}/#\n\n" in acl  # read only, nothing else
    assert (
        f"user 0\ntopic readwrite {BASE}/status/0\ntopic write {BASE}/round/+/ack/0\n"
        f"topic write {BASE}/round/+/up/0\n" in acl
    )
    assert f"topic read {BASE}/round/+/down/0" in acl
    assert f"topic read {BASE}/round/+/down/1\n" not in acl.split("user 1")[0]
    env = read_env_file(setup.env_file("0"))
    assert env["MQTTFL_BROKER__USERNAME"] == "0"
    assert env["MQTTFL_BROKER__TLS_CA"] == str(setup.ca)


def test_init_with_ids_refuses_bad_identities_and_overwrites(tmp_path: Path) -> None:
    init_broker(tmp_path / "b", client_ids(ids="kitchen,hall"))
    assert "cafile" not in (tmp_path / "b" / "mosquitto.conf").read_text()
    assert (
        "user kitchen\ntopic readwrite mqttfl/+/status/kitchen"
        in (tmp_path / "b" / "acl").read_text()
    )
    with pytest.raises(MqttflError, match="--force"):
        init_broker(tmp_path / "b", ["kitchen"])
    for ids in ("a/b", "coordinator", "watch", "x,x", "all", ""):
        with pytest.raises(MqttflError):
            client_ids(ids=ids)
    bad = mqttfl("broker", "init", "--ids", "a/b", "--out", str(tmp_path / "c"))  # one line, exit 2
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "a/b" in bad.stderr


def test_anonymous_and_wrong_password_are_refused(
    setup: BrokerSetup, secure_broker: LocalBroker
) -> None:
    anonymous = pub(setup, None, f"{BASE}/round/1/up/0")
    assert anonymous.returncode != 0
    assert "not authori" in (anonymous.stderr + anonymous.stdout).lower()
    wrong = pub(setup, "0", f"{BASE}/round/1/up/0", password="guess")
    assert wrong.returncode != 0
    assert "not authori" in (wrong.stderr + wrong.stdout).lower()
    stolen = pub(
        setup, "0", f"{BASE}/round/1/up/0", password=setup.passwords["1"]
    )  # B's password for A
    assert stolen.returncode != 0
    plain = subprocess.run(
        [
            "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(setup.port),
            "-u",
            "0",
            "-P",
            setup.passwords["0"],
            "-t",
            f"{BASE}/round/1/up/0",
            "-m",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert plain.returncode != 0  # no TLS, no talk


def test_a_client_can_only_publish_its_own_topics(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    coordinator = Sub(setup, "coordinator", [f"{BASE}/#"], tmp_path / "coordinator.out")
    try:
        forged = [
            f"{BASE}/round/1/up/1",
            f"{BASE}/round/1/metrics/1",
            f"{BASE}/status/1",
            f"{BASE}/state",
            f"{BASE}/round/2/start",
            f"{BASE}/round/1/down/all",
            f"{BASE}/round/1/down/1",
            "mqttfl/other/x",
        ]
        for topic in forged:  # client 0 impersonating client 1 or the coordinator
            denied = pub(setup, "0", topic, "forged")
            assert "not authorized" in (denied.stderr + denied.stdout).lower(), topic
        assert pub(setup, "0", f"{BASE}/round/1/up/0", "own").returncode == 0
        coordinator.wait_for(f"{BASE}/round/1/up/0 own")
    finally:
        coordinator.stop()
    assert coordinator.lines() == [f"{BASE}/round/1/up/0 own"]  # none of the forgeries arrived


def test_the_watch_identity_reads_the_run_but_cannot_publish(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    watcher = Sub(setup, "watch", [f"{BASE}/#"], tmp_path / "watch.out")
    try:
        for topic in (f"{BASE}/state", f"{BASE}/round/1/start", f"{BASE}/status/0"):
            denied = pub(setup, "watch", topic, "forged")
            assert "not authorized" in (denied.stderr + denied.stdout).lower(), topic
        assert pub(setup, "coordinator", f"{BASE}/round/1/start", "start").returncode == 0
        assert pub(setup, "0", f"{BASE}/round/1/up/0", "upload").returncode == 0
        watcher.wait_for(f"{BASE}/round/1/start start")
        watcher.wait_for(f"{BASE}/round/1/up/0 upload")
    finally:
        watcher.stop()
    assert all("forged" not in line for line in watcher.lines()), watcher.lines()


def test_mqttfl_watch_connects_with_the_watch_credentials_over_tls(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    # A run the broker holds something of (a run that holds nothing is an error of its own).
    state = tmp_path / "state"
    state.write_bytes(RunStatus("waiting", 0).encode(RUN_ID))
    retained = [*_as(setup, "coordinator"), "-q", "1", "-r", "-t", f"{BASE}/state", "-V", "mqttv5"]
    subprocess.run(["mosquitto_pub", *retained, "-f", str(state)], check=True, timeout=20)
    try:
        result = mqttfl(
            "watch",
            "--broker",
            setup.url,
            "--run",
            RUN_ID,
            "--once",
            env=setup.env("watch"),
            timeout=60,
        )
    finally:
        subprocess.run(["mosquitto_pub", *retained, "-n"], check=True, timeout=20)
    assert result.returncode == 0, result.stderr
    assert f"run {RUN_ID} · broker connected" in result.stdout


def test_a_client_cannot_read_another_clients_downlink(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    spy = Sub(
        setup,
        "0",
        [f"{BASE}/round/+/down/1", f"{BASE}/round/+/up/+", "mqttfl/#", f"{BASE}/round/+/down/0"],
        tmp_path / "spy.out",
    )
    try:
        for topic in (f"{BASE}/round/1/down/1", f"{BASE}/round/1/up/1"):
            assert (
                pub(setup, "coordinator" if "down" in topic else "1", topic, "secret").returncode
                == 0
            )
        assert pub(setup, "coordinator", f"{BASE}/round/1/down/0", "mine").returncode == 0
        spy.wait_for(f"{BASE}/round/1/down/0 mine")
    finally:
        spy.stop()
    assert all("secret" not in line for line in spy.lines()), spy.lines()


def test_an_oversize_publish_disconnects_its_sender(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (MAX_PACKET + 100_000))
    result = subprocess.run(
        [
            "mosquitto_pub",
            *_as(setup, "0"),
            "-q",
            "1",
            "-t",
            f"{BASE}/round/1/up/0",
            "-f",
            str(big),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    log = (setup.out / "mosquitto.log").read_text()
    assert "disconnected due to oversize packet" in log


@pytest.mark.slow
def test_a_legitimate_federation_completes_under_these_rules(
    setup: BrokerSetup, secure_broker: LocalBroker, tmp_path: Path
) -> None:
    fed = Federation(tmp_path, secure_broker, clients=2, rounds=2, broker_url=setup.url)
    with fed:
        fed.start_coordinator(env=setup.env("coordinator"))
        for cid in ("0", "1"):
            fed.start_client(cid, env=setup.env(cid))
        fed.wait_round_started(1, timeout=120)
        for name, proc in fed.procs.items():  # the password never shows in `ps`
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
            assert all(pw not in cmdline for pw in setup.passwords.values()), name
            assert "mqtts://" in cmdline
        summary = fed.finish(timeout=120)
    assert summary["rounds_completed"] == 2
    assert summary["rejections"] == {}
    assert set(summary["clients"]) == {"0", "1"}
    log = (setup.out / "mosquitto.log").read_text()
    assert "u'coordinator'" in log
    assert "u'0'" in log
    print("FIGURES security", json.dumps({"federation_under_acl_and_tls": "completed"}))


def test_credentials_come_from_config_or_environment_never_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="MQTTFL_BROKER__PASSWORD"):
        load_config("configs/fedapa-csi.toml", ["broker.password=hunter2"])
    monkeypatch.setenv("MQTTFL_BROKER__PASSWORD", "from-env")
    monkeypatch.setenv("MQTTFL_BROKER__TLS_CA", "/ca.crt")
    config = tmp_path / "c.toml"
    config.write_text('run_id = "r"\n[broker]\nusername = "0"\npassword = "from-file"\n')
    broker = load_config(config).broker
    assert (broker.username, broker.password, broker.tls_ca) == ("0", "from-env", "/ca.crt")
    monkeypatch.delenv("MQTTFL_BROKER__PASSWORD")
    assert load_config(config).broker.password == "from-file"
