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
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttfl.provisioning.broker_init import read_env_file
from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import Federation, Witness, read_events, wait_for
from tests.helpers import FAST, REPO
from tests.locked import Locked, Started, locked_broker, wait_all

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
def scene() -> Iterator[tuple[Locked, Witness]]:
    with locked_broker(RUN, clients=3) as broker:
        watch = read_env_file(broker.credentials / "watch.env")
        port = int(broker.url.rsplit(":", 1)[1])
        user, password = watch["MQTTFL_BROKER__USERNAME"], watch["MQTTFL_BROKER__PASSWORD"]
        with Witness(port, [f"mqttfl/{RUN}/#"], username=user, password=password) as witness:
            yield broker, witness


@pytest.fixture(scope="module")
def played(scene: tuple[Locked, Witness]) -> dict[str, Started]:
    broker, _ = scene
    seen: dict[str, Started] = {}
    coordinator = ["--config", DP_CONFIG, "--broker", broker.url, "--out", "run"]
    seen["coordinator"] = broker.start(
        "coordinator", "coordinator", *coordinator, *sets(RUN_SETTINGS), identity="coordinator"
    )
    log = broker.work / "coordinator" / "run" / "logs" / "coordinator.jsonl"
    wait_for(lambda: log.exists() and "run.started" in log.read_text(), timeout=120, what="run")
    device = ["--run", RUN, "--broker", broker.url]
    # Device 2, four times, with settings of its own.
    for name, own in (
        ("own-rounds", ["--set", "rounds=15"]),
        ("own-tau", ["--set", "method.tau=0.9"]),
        ("no-privacy", ["--set", "privacy.enabled=false"]),
        (
            "own-config",
            [*sets([*FAST, "model.name=tiny", f"run_id={RUN}"]), "--config", PLAIN_CONFIG],
        ),
    ):
        joined = own if name == "own-config" else [*device, *own]
        where = ["--broker", broker.url] if name == "own-config" else []
        seen[name] = broker.start(name, "client", "--id", "2", *joined, *where, identity="2")
    # Devices 0 and 1: their id, their credentials, the broker's URL.
    for client in ("0", "1"):
        seen[f"device-{client}"] = broker.start(
            f"device-{client}", "client", "--id", client, *device, identity=client
        )
    wait_all([seen[n] for n in ("own-rounds", "own-tau", "no-privacy", "own-config")], 180)
    wait_all([seen[n] for n in ("coordinator", "device-0", "device-1")], 420)
    # After the run: a device that was not part of it, started in a fresh folder.
    seen["after-the-end"] = broker.start(
        "after-the-end", "client", "--id", "1", *device, identity="1"
    )
    wait_all([seen["after-the-end"]], 120)
    return seen


def differing(started: Started) -> str:
    assert started.proc.returncode == 2, started.stderr[-3000:]
    line = started.one_error_line()
    assert "differ from the manifest of run 'manifest-test'" in line, line
    return line


def test_devices_with_no_config_train_the_coordinators_overridden_schedule(
    played: dict[str, Started],
) -> None:
    for name in ("coordinator", "device-0", "device-1"):
        assert played[name].proc.returncode == 0, played[name].stderr[-3000:]
    summary = json.loads((played["coordinator"].folder / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    assert summary["rejections"] == {}, summary["rejections"]  # every upload declared DP
    assert summary["privacy"]["uploads"] == {"0": 3, "1": 3}
    for client in ("0", "1"):
        folder = played[f"device-{client}"].folder
        events = read_events(folder / "logs" / f"client-{client}.jsonl")
        assert [e["round"] for e in events if e["event"] == "upload.sent"] == [1, 2, 3]
        [received] = [e for e in events if e["event"] == "manifest.received"]
        kept = folder / "client-state" / RUN / "manifest.json"
        assert json.loads(kept.read_text())["digest"].startswith(received["digest"])


def test_a_device_whose_settings_differ_stops_naming_each_key(
    played: dict[str, Started],
) -> None:
    assert "rounds: 15 here, 3 in the run" in differing(played["own-rounds"])
    assert "method.tau: 0.9 here, 0.5 in the run" in differing(played["own-tau"])
    assert "privacy.enabled: false here, true in the run" in differing(played["no-privacy"])
    whole = differing(played["own-config"])
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
    played: dict[str, Started], scene: tuple[Locked, Witness]
) -> None:
    _, witness = scene
    about_2 = witness.seen(lambda m: m.topic.rsplit("/", 1)[-1] == "2")
    assert about_2 == [], [m.topic for m in about_2]
    assert witness.seen(lambda m: m.topic.endswith("/up/0"))  # the witness saw the run


def test_a_device_started_after_the_run_finished_exits_naming_when(
    played: dict[str, Started],
) -> None:
    late = played["after-the-end"]
    assert late.proc.returncode == 2, late.stderr[-3000:]
    line = late.one_error_line()
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
