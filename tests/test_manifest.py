"""One run, many processes: the run's contract travels with the run (its manifest).

On a broker from `mqttfl broker init` (3 client identities, locked), a coordinator runs the
DP config with ``--set`` overrides (3 rounds, 2 clients, a shorter warm-up). Devices 0 and
1 start with their id, their credentials and the broker's URL only: they train the
coordinator's schedule under the run's privacy mechanism. Device 2 tries with settings of
its own that differ from the run's (its rounds, a FedAPA key, privacy off, or a whole
config file): each stops before it publishes anything, naming every differing key with
both values, and a subscriber with the watch identity sees nothing of client 2. After the
run, a device started afresh exits at once, naming when the run finished.

Apart from the deployment, on an open broker: clients whose coordinator is killed stop
once the configured time without a live coordinator has passed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttfl.provisioning.broker_init import read_env_file
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from tests.faults import Federation, Witness, read_events
from tests.helpers import FAST, REPO
from tests.test_deploy_mistakes import Deployment, Seen, wait, wait_for_line

pytestmark = pytest.mark.slow

RUN = "manifest-test"
DP_CONFIG = str(REPO / "configs" / "fedapa-csi-dp.toml")
PLAIN_CONFIG = str(REPO / "configs" / "fedapa-csi.toml")
RUN_SETTINGS = [
    *FAST,
    "model.name=tiny",
    f"run_id={RUN}",
    "rounds=3",
    "method.warmup_rounds=2",
    "federation.num_clients=2",
    "federation.min_clients=2",
]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def scene() -> Iterator[tuple[Deployment, Witness]]:
    work = Path(tempfile.mkdtemp(prefix="mqttfl-manifest-", dir="/tmp"))
    work.chmod(0o755)
    setup = work / "broker-setup"
    init = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttfl",
            "broker",
            "init",
            "--clients",
            "3",
            "--run-id",
            RUN,
            "--port",
            str(free_port()),
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
    watch = read_env_file(setup / "credentials" / "watch.env")
    with LocalBroker(
        work / "mosquitto", port=port, conf=(setup / "mosquitto.conf").read_text()
    ) as b:
        witness = Witness(
            port,
            [f"mqttfl/{RUN}/#"],
            username=watch["MQTTFL_BROKER__USERNAME"],
            password=watch["MQTTFL_BROKER__PASSWORD"],
        )
        with witness:
            yield Deployment(setup, work, b, b.url, init), witness
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def played(scene: tuple[Deployment, Witness]) -> Deployment:
    d, _ = scene
    out = d.work / "coordinator" / "run"
    coordinator = d.start(
        "coordinator",
        "coordinator",
        "--config",
        DP_CONFIG,
        "--broker",
        d.url,
        "--out",
        str(out),
        *sets(RUN_SETTINGS),
        identity="coordinator",
    )
    wait_for_line(coordinator, "run.started", timeout=120)
    device = ["--run", RUN, "--broker", d.url]
    # Device 2, four times, with settings of its own.
    d.start("own-rounds", "client", "--id", "2", *device, "--set", "rounds=15", identity="2")
    d.start("own-tau", "client", "--id", "2", *device, "--set", "method.tau=0.9", identity="2")
    d.start(
        "no-privacy", "client", "--id", "2", *device, "--set", "privacy.enabled=false", identity="2"
    )
    whole_file = [*sets([*FAST, "model.name=tiny", f"run_id={RUN}"]), "--config", PLAIN_CONFIG]
    d.start("own-config", "client", "--id", "2", "--broker", d.url, *whole_file, identity="2")
    # Devices 0 and 1: their id, their credentials, the broker's URL.
    d.start("device-0", "client", "--id", "0", *device, identity="0")
    d.start("device-1", "client", "--id", "1", *device, identity="1")
    drifted = [d.seen[n] for n in ("own-rounds", "own-tau", "no-privacy", "own-config")]
    wait(*drifted, timeout=180)
    wait(coordinator, d.seen["device-0"], d.seen["device-1"], timeout=420)
    # After the run: a device that was not part of it, started with a fresh folder.
    d.start("after-the-end", "client", "--id", "1", *device, identity="1", cwd=d.work / "late")
    wait(d.seen["after-the-end"], timeout=120)
    return d


def differing(seen: Seen) -> str:
    assert seen.rc == 2, seen.text[-3000:]
    line = seen.error()
    assert "differ from the manifest of run 'manifest-test'" in line, line
    return line


def test_devices_with_no_config_train_the_coordinators_overridden_schedule(
    played: Deployment,
) -> None:
    d = played
    for name in ("coordinator", "device-0", "device-1"):
        assert d.seen[name].rc == 0, d.seen[name].text[-3000:]
    summary = json.loads((d.work / "coordinator" / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    assert summary["rejections"] == {}, summary["rejections"]  # every upload declared DP
    assert summary["privacy"]["uploads"] == {"0": 3, "1": 3}
    for client in ("0", "1"):
        events = read_events(d.work / f"device-{client}" / "logs" / f"client-{client}.jsonl")
        assert [e["round"] for e in events if e["event"] == "upload.sent"] == [1, 2, 3]
        [received] = [e for e in events if e["event"] == "manifest.received"]
        kept = d.work / f"device-{client}" / "client-state" / RUN / "manifest.json"
        assert json.loads(kept.read_text())["digest"].startswith(received["digest"])


def test_a_device_whose_settings_differ_stops_naming_each_key(played: Deployment) -> None:
    d = played
    assert "rounds: 15 here, 3 in the run" in differing(d.seen["own-rounds"])
    assert "method.tau: 0.9 here, 0.5 in the run" in differing(d.seen["own-tau"])
    assert "privacy.enabled: false here, true in the run" in differing(d.seen["no-privacy"])
    whole = differing(d.seen["own-config"])
    for part in (
        "rounds: 15 here, 3 in the run",
        "method.warmup_rounds: 8 here, 2 in the run",
        "privacy.enabled: false here, true in the run",
        "privacy.epsilon: (absent) here, 8.0 in the run",
        "federation.num_clients: 6 here, 2 in the run",
    ):
        assert part in whole, whole
    assert "data.window" not in whole  # the same here and in the run


def test_nothing_of_a_drifted_device_reaches_the_broker(
    played: Deployment, scene: tuple[Deployment, Witness]
) -> None:
    _, witness = scene
    about_2 = witness.seen(lambda m: m.topic.rsplit("/", 1)[-1] == "2")
    assert about_2 == [], [m.topic for m in about_2]
    assert witness.seen(lambda m: m.topic.endswith("/up/0"))  # the witness saw the run


def test_a_device_started_after_the_run_finished_exits_naming_when(played: Deployment) -> None:
    late = played.seen["after-the-end"]
    assert late.rc == 2, late.text[-3000:]
    line = late.error()
    assert "finished" in line, line
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line), line


def test_clients_stop_once_their_coordinator_has_been_gone_for_the_configured_time(
    broker: LocalBroker, tmp_path: Path
) -> None:
    orphan = ["federation.round_timeout_s=60", "broker.orphan_timeout_s=4"]
    with Federation(tmp_path, broker, clients=2, rounds=50, overrides=orphan) as fed:
        fed.start()
        fed.wait_round_closed(1, timeout=180)
        fed.kill("coordinator")
        for client in ("0", "1"):
            assert fed.procs[client].wait(timeout=120) == 2
            said = [line for line in fed.output(client).splitlines() if "mqttfl: error:" in line]
            assert len(said) == 1, fed.output(client)[-3000:]
            assert "has had no live coordinator for 4 s" in said[0], said[0]
            assert "Traceback" not in fed.output(client)


def test_a_coordinator_resumes_from_the_manifest_in_its_run_dir_without_a_config(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path, broker, clients=2, rounds=4) as fed:
        fed.start()
        fed.wait_round_closed(2, timeout=180)
        fed.kill("coordinator")
        assert (fed.out / "manifest.json").is_file()
        fed._spawn("coordinator", ["coordinator", "--broker", broker.url, "--out", str(fed.out)])
        summary = fed.finish(timeout=240)
    assert summary["rounds_completed"] == 4
    [resumed] = fed.events(event="run.resumed")
    assert resumed["from_round"] >= 3
    instances = {e["instance"] for c in ("0", "1") for e in fed.events(c, "run.joined")}
    assert len(instances) == 1  # the resumed run is the same instance: no client started over
