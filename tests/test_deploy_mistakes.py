"""The mistakes people make while setting devices up, each made for real.

One broker made by `mqttfl broker init` (2 client identities, a config that wants 3), its
Mosquitto, one coordinator and two good clients; around them, every mistake
as a real process, typed as a person would. Each asserts the one line the person sees,
the exit code, and how soon it came: counted from the process's first log line (when it
is ready to talk to the broker; importing torch on a loaded machine comes before that),
and in total (for a client, from its runner's first line, once the run's manifest came and
its model is built). Refusals the broker reports at once must come within 15 s.

The measured rows are printed (run with ``-s`` to see them) for the issue's closing note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from mqttfl.config import load_config
from mqttfl.provisioning.broker_init import read_env_file
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from tests.helpers import FAST, REPO

pytestmark = pytest.mark.slow

RUN = "deploy-test"
CONFIG = str(REPO / "configs" / "fedapa-csi.toml")
SETTINGS = [
    *FAST,
    f"run_id={RUN}",
    "rounds=1",
    "federation.num_clients=3",  # broker init made 2 identities: client 2 never comes
    "federation.min_clients=2",
    "federation.join_timeout_s=5",
    "federation.final_metrics_timeout_s=10",
]
SETS = [arg for s in SETTINGS for arg in ("--set", s)]
AT_ONCE_S = 15.0  # errors the broker reports at once
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", re.MULTILINE)


@dataclass
class Seen:
    """One process a person started, and what they saw."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    began: float = field(default_factory=time.time)
    ended: float = 0.0
    said: float = 0.0  # when its error line appeared (polled every 0.1 s)

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def rc(self) -> int | None:
        return self.proc.poll()

    def errors(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.startswith("mqttfl: error:")]

    def error(self) -> str:
        """The one error line (asserting that there is exactly one, and no traceback)."""
        found = self.errors()
        assert len(found) == 1, self.text[-3000:]
        assert "Traceback" not in self.text, self.text[-3000:]
        return found[0]

    @property
    def seconds(self) -> float:
        return round(self.ended - self.began, 1)

    def ready(self) -> float | None:
        """When it was ready to talk to the broker, or None: a client's runner once built
        (``client.started``: torch imported, its shard built, after the run's manifest
        came), else the process's first log line."""
        text = self.text
        runner = text.find("client.started")
        first = STAMP.search(text[text.rfind("\n", 0, runner) + 1 :] if runner >= 0 else text)
        if first is None:
            return None
        return datetime.fromisoformat(first.group(1) + "+00:00").timestamp()

    @property
    def after_ready(self) -> float | None:
        """Seconds from its first log line to its exit (None: it logged nothing)."""
        ready = self.ready()
        return None if ready is None else round(self.ended - ready, 1)

    @property
    def line_after_ready(self) -> float | None:
        """Seconds from its first log line to its error line."""
        ready = self.ready()
        return None if ready is None or not self.said else round(self.said - ready, 1)

    def within(self, bound: float) -> bool:
        """Its error line, and its exit, came within ``bound`` s of its first log line."""
        after, line = self.after_ready, self.line_after_ready
        assert after is not None, f"{self.name} logged nothing: {self.text[-2000:]}"
        assert line is not None, f"{self.name} printed no error line: {self.text[-2000:]}"
        return max(after, line) <= bound


@dataclass
class Deployment:
    setup: Path
    work: Path
    broker: LocalBroker
    url: str
    init: subprocess.CompletedProcess[str]
    seen: dict[str, Seen] = field(default_factory=dict)

    def env(self, identity: str | None, **extra: str) -> dict[str, str]:
        """The environment of a fresh shell on a device: no broker credentials unless
        ``identity``'s file was sourced (``set -a; . credentials/<id>.env; set +a``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQTTFL_BROKER__")}
        if identity is not None:
            env.update(read_env_file(self.setup / "credentials" / f"{identity}.env"))
        return {**env, "PYTHONPATH": str(REPO), **extra}

    def start(
        self, name: str, *args: str, identity: str | None, cwd: Path | None = None, **extra: str
    ) -> Seen:
        folder = cwd or self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        log = self.work / f"{name}.out"
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mqttfl", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env=self.env(identity, **extra),
                start_new_session=True,
            )
        self.seen[name] = seen = Seen(name, proc, log)
        return seen

    def client(
        self,
        name: str,
        client_id: str,
        *more: str,
        identity: str | None,
        broker: str | None = None,
        cwd: Path | None = None,
        **extra: str,
    ) -> Seen:
        args = ["--config", CONFIG, "--id", client_id, "--broker", broker or self.url]
        return self.start(name, "client", *args, *SETS, *more, identity=identity, cwd=cwd, **extra)

    def coordinator(self, name: str, *more: str) -> Seen:
        out = self.work / name / "run"
        return self.start(
            name,
            "coordinator",
            "--config",
            CONFIG,
            "--broker",
            self.url,
            "--out",
            str(out),
            *SETS,
            *more,
            identity="coordinator",
        )


def wait(*seen: Seen, timeout: float) -> None:
    deadline = time.time() + timeout
    pending = list(seen)
    while pending:
        for one in list(pending):
            if not one.said and "mqttfl: error:" in one.text:
                one.said = time.time()
            if one.rc is not None:
                if not one.said and "mqttfl: error:" in one.text:
                    one.said = time.time()
                one.ended = time.time()
                pending.remove(one)
        if pending and time.time() > deadline:
            for one in pending:
                os.killpg(one.proc.pid, 9)
                one.proc.wait()
            raise AssertionError(
                "still running: " + "; ".join(f"{o.name}: {o.text[-1500:]}" for o in pending)
            )
        time.sleep(0.1)


def wait_for_line(seen: Seen, text: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while text not in seen.text:
        assert seen.rc is None, f"{seen.name} exited {seen.rc}: {seen.text[-3000:]}"
        assert time.time() < deadline, f"{seen.name} never said {text!r}: {seen.text[-3000:]}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    # Outside pytest's private (0700) temp folders, so the broker can drop root and still
    # reach its files, as it would in a deployment.
    work = Path(tempfile.mkdtemp(prefix="mqttfl-deploy-", dir="/tmp"))
    work.chmod(0o755)
    wants_three = work / "three.toml"
    wants_three.write_text(f'run_id = "{RUN}"\n[federation]\nnum_clients = 3\n')
    setup = work / "broker-setup"
    init = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttfl",
            "broker",
            "init",
            "--clients",
            "2",
            "--run-id",
            RUN,
            "--port",
            str(free_port()),
            "--config",
            str(wants_three),
            "--out",
            str(setup),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert init.returncode == 0, init.stderr
    port = int(re.findall(r"^listener (\d+)", (setup / "mosquitto.conf").read_text(), re.M)[0])
    broker = LocalBroker(work / "mosquitto", port=port, conf=(setup / "mosquitto.conf").read_text())
    with broker:
        yield Deployment(setup, work, broker, broker.url, init)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def played(deployment: Deployment) -> Deployment:
    """The whole scene, in the order a person would live it."""
    d = deployment
    first = d.coordinator("coordinator", "--local-reference")
    wait_for_line(first, "run.started", timeout=120)
    # Someone starts a second coordinator for the same run.
    second = d.coordinator("second-coordinator")
    # Devices: two good ones (one typed the broker without a scheme), and three mistakes.
    d.client("client-0", "0", identity="0")
    d.client("client-1", "1", identity="1", broker=d.url.removeprefix("mqtt://"))
    wrong = d.client("wrong-password", "0", identity="0", MQTTFL_BROKER__PASSWORD="guess-again")
    none = d.client("no-credentials", "1", identity=None)
    borrowed = d.client("id-2-with-0s-credentials", "2", identity="0")
    wait(second, wrong, none, borrowed, timeout=240)
    wait(first, d.seen["client-0"], d.seen["client-1"], timeout=300)
    # Afterwards: the run id used again, a device with another config's saved model, and
    # a watch of a run that does not exist.
    d.coordinator("coordinator-again")
    d.client("client-again", "1", identity="1", cwd=d.work / "client-again")
    d.client("other-model", "0", "--set", "model.name=tiny", identity="0", cwd=d.work / "client-0")
    d.start(
        "watch-nothing",
        "watch",
        "--broker",
        d.url,
        "--run",
        "no-such-run",
        "--once",
        identity="watch",
    )
    wait(
        *(d.seen[n] for n in ("coordinator-again", "client-again", "other-model", "watch-nothing")),
        timeout=240,
    )
    rows = [
        {
            "mistake": name,
            "rc": s.rc,
            "seconds": s.seconds,
            "after_ready": s.after_ready,
            "line_after_ready": s.line_after_ready,
            "line_after_start": round(s.said - s.began, 1) if s.said else None,
            "line": (s.errors() or [""])[0],
        }
        for name, s in d.seen.items()
    ]
    sys.stdout.write("\n" + json.dumps(rows, indent=1) + "\n")
    return d


def test_a_wrong_password_names_the_refusal_the_user_and_the_credentials(
    played: Deployment,
) -> None:
    seen = played.seen["wrong-password"]
    line = seen.error()
    assert seen.rc == 2
    assert "refused user '0': not authorized (MQTT reason code 135)" in line
    assert "MQTTFL_BROKER__PASSWORD" in line
    assert "credentials/0.env" in line
    assert seen.within(AT_ONCE_S), seen.text[-2000:]
    assert "could not connect" not in seen.text  # no 10 s retry blamed on the network


def test_the_readme_command_without_credentials_says_so(played: Deployment) -> None:
    seen = played.seen["no-credentials"]
    line = seen.error()
    assert seen.rc == 2
    assert "refused an anonymous login (no user name): not authorized" in line
    assert "set -a; . credentials/1.env; set +a" in line
    assert seen.within(AT_ONCE_S)


def test_a_device_with_another_ids_credentials_stops_before_reporting(played: Deployment) -> None:
    seen = played.seen["id-2-with-0s-credentials"]
    line = seen.error()
    assert seen.rc == 2
    assert f"client '2' (user '0') may not publish to mqttfl/{RUN}/status/2" in line
    assert "MQTT reason code 135" in line
    assert "round.evaluated" not in seen.text
    assert "run.finished" not in seen.text
    assert seen.within(AT_ONCE_S)


def test_a_second_coordinator_stops_and_never_disturbs_the_first(played: Deployment) -> None:
    second, first = played.seen["second-coordinator"], played.seen["coordinator"]
    line = second.error()
    assert second.rc == 2
    assert f"run '{RUN}' already has a live coordinator (pid {first.proc.pid}" in line
    assert second.seconds <= 60
    assert second.within(AT_ONCE_S)
    assert "broker.disconnected" not in first.text
    assert "Session taken over" not in first.text
    assert first.rc == 0, first.text[-3000:]


def test_the_deployment_ends_with_the_result_table_and_a_report_with_local(
    played: Deployment,
) -> None:
    first = played.seen["coordinator"]
    method = load_config(CONFIG).method  # the default job's, whichever it is
    assert f"{method} on run {RUN}: 1 rounds" in first.text
    assert re.search(r"client\s+accuracy\s+local\s+gain", first.text), first.text[-3000:]
    assert re.search(r"^\s+mean\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+", first.text, re.M)
    out = played.work / "coordinator" / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert {"0", "1"} <= set(summary["local_reference"]["gain"]["clients"])
    report = subprocess.run(
        [sys.executable, "-m", "mqttfl", "report", str(out), "--out", str(played.work / "report")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert report.returncode == 0, report.stderr
    gain = summary["local_reference"]["gain"]["mean"] * 100
    assert f"| {gain:+.2f} |" in report.stdout


def test_join_lines_and_the_join_timeout_name_the_missing_ids(played: Deployment) -> None:
    text = played.seen["coordinator"].text
    joined = next(line for line in text.splitlines() if "clients.joined" in line)
    assert "all_joined=False" in joined
    assert "missing=[" in joined
    assert "'2'" in joined
    online = [line for line in text.splitlines() if "client.online" in line]
    assert online
    assert all("waiting_for=[" in line and "'2'" in line for line in online)


def test_broker_init_warns_when_its_ids_miss_the_configs_clients(played: Deployment) -> None:
    warning = played.init.stderr
    assert "federation.num_clients = 3" in warning
    assert "without a login (2)" in warning
    assert "--clients 3" in warning


def test_a_broker_url_without_a_scheme_is_taken_as_mqtt_and_says_so(played: Deployment) -> None:
    seen = played.seen["client-1"]
    bare = played.url.removeprefix("mqtt://")
    assert f"mqttfl: note: --broker '{bare}' has no scheme: taken as {played.url}" in seen.text
    assert seen.rc == 0
    assert "run.finished" in seen.text


def test_a_finished_run_id_used_again_says_when_and_how_to_start_afresh(
    played: Deployment,
) -> None:
    for name in ("coordinator-again", "client-again"):
        seen = played.seen[name]
        line = seen.error()
        assert seen.rc == 2, seen.text[-2000:]
        assert re.search(
            rf"run '{RUN}' already finished at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC", line
        )
        assert "--set run_id=NEW" in line
        assert "--clear-run" in line
        assert seen.within(AT_ONCE_S)


def test_another_configs_saved_state_is_one_line_not_a_traceback(played: Deployment) -> None:
    seen = played.seen["other-model"]
    assert seen.rc == 2, seen.text[-2000:]
    seen.error()  # exactly one line, no traceback (before or after state per run lands)


def test_watching_a_run_that_does_not_exist_is_an_error(played: Deployment) -> None:
    seen = played.seen["watch-nothing"]
    assert seen.rc == 2
    assert "--run 'no-such-run': the broker" in seen.error()
    assert seen.seconds <= 60


def test_defaults_land_where_help_says_and_mosquitto_does_not_run_as_root(
    played: Deployment,
) -> None:
    device = played.work / "client-0"
    assert (device / "logs" / "client-0.jsonl").is_file()
    assert any((device / "client-state").iterdir())
    log = (played.setup / "mosquitto.log").read_text()
    assert "should not be run as root" not in log
    if os.geteuid() == 0:
        assert played.broker.process is not None
        status = Path(f"/proc/{played.broker.process.pid}/status").read_text()
        uid = re.search(r"^Uid:\s+(\d+)", status, re.M)
        assert uid
        assert uid.group(1) != "0"
    helptext = subprocess.run(
        [sys.executable, "-m", "mqttfl", "client", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    ).stdout
    assert "./logs/client-<id>.jsonl" in helptext
    assert "./client-state" in helptext
