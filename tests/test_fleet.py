"""Client fleets: many client runners in one process, each its own device to the broker.

A fleet of twenty completes a run next to a coordinator process; SIGKILL of one of two
fleets is a mass dropout the coordinator closes its later rounds around; `mqttfl run
--fleets 2` gives each fleet client its own identity on the run's locked broker; and one
runner that fails says ``offline`` and stops alone.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Incoming
from mqttfl.config import load_config
from mqttfl.errors import MqttflError
from mqttfl.nodes.fleet import (
    Fleet,
    format_ids,
    parse_ids,
    runner_credentials,
    split_ids,
)
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire.control import Offline, Online, read_status
from tests.faults import CONFIG, RUN_ID, TINY, Federation, Witness, read_events, timestamp
from tests.helpers import mqttfl

# Twenty tiny clients take turns on two loaded cores: a round's deadline with headroom.
ROOMY = ["federation.min_clients=2", "federation.round_timeout_s=30"]


def _ids(first: int, last: int) -> list[str]:
    return [str(n) for n in range(first, last + 1)]


def start_fleet(fed: Federation, name: str, ids: str, *extra: str) -> None:
    """`mqttfl fleet` as one more process of the harness (killed and reaped with it)."""
    args = ["fleet", *fed._common(), "--ids", ids, "--state-dir", str(fed.state_dir), *extra]
    fed._spawn(name, args)


# --- --ids ---------------------------------------------------------------------------
def test_ids_take_ranges_and_lists() -> None:
    assert parse_ids("0-9,12,20-29") == [*_ids(0, 9), "12", *_ids(20, 29)]
    assert parse_ids("7") == ["7"]
    assert parse_ids(" 3 , 1-2 ") == ["3", "1", "2"]  # the order given is kept
    assert parse_ids("5-5") == ["5"]
    assert parse_ids("room-a,gw_2.b") == ["room-a", "gw_2.b"]  # a name with a dash is one id
    assert parse_ids("007-010") == ["007", "008", "009", "010"]  # zero-padding is kept
    assert parse_ids("0-9999") == _ids(0, 9999)
    assert format_ids(parse_ids("0-9,12,20-29,room-a,007")) == "0-9,12,20-29,room-a,007"
    assert split_ids(_ids(0, 6), 3) == [["0", "1", "2"], ["3", "4"], ["5", "6"]]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "an empty item"),
        ("1,,2", "an empty item"),
        ("9-0", "runs backwards"),
        ("1-3,2", "'2' is listed twice"),
        ("-5", "not a range"),
        ("5-", "not a range"),
        ("3-a", "not a range"),
        ("07-100", "equal width"),
        ("a/b", "must match"),
        ("all", "must match"),
        ("coordinator", "coordinator's identity"),
        ("0-10000", "more than 10000"),
        ("0-99999999999999999999", "more than 10000"),
    ],
)
def test_bad_ids_are_errors_naming_the_item(text: str, error: str) -> None:
    with pytest.raises(MqttflError, match=error):
        parse_ids(text)


def test_credentials_per_runner_from_env_files(tmp_path: Path) -> None:
    base = Credentials("shared", "secret", tls_ca="/ca.crt")
    assert runner_credentials(base, ["0", "1"], None) == {"0": base, "1": base}
    (tmp_path / "0.env").write_text("MQTTFL_BROKER__USERNAME=0\nMQTTFL_BROKER__PASSWORD=p0\n")
    (tmp_path / "1.env").write_text("# one identity\nMQTTFL_BROKER__USERNAME=1\n")
    found = runner_credentials(base, ["0", "1"], tmp_path)
    assert found["0"] == Credentials("0", "p0", tls_ca="/ca.crt")
    assert found["1"] == Credentials("1", "secret", tls_ca="/ca.crt")
    with pytest.raises(MqttflError, match=r"no 2\.env \(1 of the 3 clients"):
        runner_credentials(base, ["0", "1", "2"], tmp_path)


# --- whole runs ------------------------------------------------------------------------
@pytest.mark.slow
def test_a_fleet_of_twenty_clients_completes_a_run(broker: LocalBroker, tmp_path: Path) -> None:
    with Federation(tmp_path, broker, clients=20, rounds=2, overrides=ROOMY) as fed:
        fed.start_coordinator()
        start_fleet(fed, "fleet", "0-19")
        summary = fed.finish(timeout=110)
    assert sorted(summary["clients"], key=int) == _ids(0, 19)
    assert summary["rounds_completed"] == 2
    assert summary["missing_uploads"] == 0
    assert fed.events(event="clients.joined")[0]["live"] == 20
    # One process, twenty MQTT sessions: each runner connected and trained as itself.
    events = read_events(fed.logs / "fleet-0-19.jsonl")
    connected = {e["client_id"] for e in events if e["event"] == "broker.connected"}
    assert connected == set(_ids(0, 19))
    assert not [e for e in events if e["event"] == "fleet.client_failed"]
    assert {e["client_id"] for e in events if e["event"] == "upload.sent"} == set(_ids(0, 19))


@pytest.mark.slow
def test_killing_a_fleet_is_a_mass_dropout_the_coordinator_closes_around(
    broker: LocalBroker, tmp_path: Path
) -> None:
    lost, kept = _ids(0, 9), _ids(10, 19)
    with Federation(tmp_path, broker, clients=20, rounds=4, overrides=ROOMY) as fed:
        fed.start_coordinator()
        start_fleet(fed, "fleet-a", "0-9", "--workers", "1")
        start_fleet(fed, "fleet-b", "10-19", "--workers", "1")
        fed.wait_round_closed(1, timeout=90)
        fed.kill("fleet-a")  # a site losing power: ten devices at once, no last words
        summary = fed.finish(timeout=90)
    closed = fed.closed_rounds()
    assert sorted(closed) == [1, 2, 3, 4]
    assert summary["rounds_completed"] == 4
    assert fed.stalled_rounds() == []
    for t in (2, 3, 4):  # every last will was heard: no round waited out its deadline
        opened = max(timestamp(e) for e in fed.started(t))
        assert timestamp(closed[t][-1]) - opened < fed.round_timeout_s, t
    assert {e["client"] for e in fed.events(event="client.offline")} == set(lost)
    accepted = {key for key, found in fed.outcomes().items() if "accepted" in found}
    assert {c for t, c in accepted if t == 1} == set(lost + kept)
    assert {c for t, c in accepted if t == 2} >= set(kept)  # open at the kill, closed on time
    for t in (3, 4):  # the rounds opened after the wills: the other fleet's clients only
        assert {c for u, c in accepted if u == t} == set(kept)
        assert closed[t][-1]["uploads"] == len(kept)
        assert closed[t][-1]["missing"] == []


@pytest.mark.slow
def test_mqttfl_run_with_two_fleets_completes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = [*TINY, "federation.num_clients=4", "federation.min_clients=2", "rounds=2"]
    result = mqttfl(
        "run",
        CONFIG,
        "--out",
        str(out),
        "--fleets",
        "2",
        # The fleets are the subject; the Local reference (trained in this process after
        # the run, test_reference.py's subject) made this time out on a loaded machine.
        "--no-local-reference",
        *[arg for item in sets for arg in ("--set", item)],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["clients"]) == ["0", "1", "2", "3"]
    assert summary["missing_uploads"] == 0
    logs = sorted(path.name for path in (out / "logs").glob("*.jsonl"))
    assert logs == ["coordinator.jsonl", "fleet-0-1.jsonl", "fleet-2-3.jsonl", "launcher.jsonl"]
    # Each fleet client logged in to the run's locked broker as its own identity.
    broker_log = (out / "broker" / "mosquitto.log").read_text()
    for client in summary["clients"]:
        assert re.search(rf"as mqttfl-{RUN_ID}-client-{client} \(.*u'{client}'\)", broker_log)


# --- one runner failing ----------------------------------------------------------------
@pytest.mark.slow
async def test_a_failing_runner_says_offline_and_stops_alone(
    broker: LocalBroker, tmp_path: Path
) -> None:
    config = load_config(CONFIG, [*TINY, "federation.num_clients=3", "rounds=2"])
    ids = ["0", "1", "2"]
    fleet = Fleet(
        config,
        BrokerAddress.parse(broker.url),
        ids,
        state_dir=tmp_path / "state",
        credentials=runner_credentials(Credentials(), ids, None),
        workers=1,
    )
    with Witness(broker.port, [f"mqttfl/{RUN_ID}/status/+"]) as witness:
        fleet.build()

        def broken(incoming: Incoming) -> None:
            raise RuntimeError("a bug in client 1")

        fleet.runners["1"]._read = broken  # type: ignore[method-assign]  # its first message
        running = asyncio.create_task(fleet.run())

        def statuses() -> dict[str, Online | Offline]:
            found = {}
            for seen in witness.seen(lambda m: bool(m.payload)):
                client = seen.topic.rsplit("/", 1)[1]
                found[client] = read_status(seen.payload, run_id=RUN_ID, client=client)
            return found

        deadline = time.monotonic() + 30
        while not (
            isinstance(statuses().get("1"), Offline)
            and all(isinstance(statuses().get(c), Online) for c in ("0", "2"))
            and "1" in fleet.failed
        ):
            assert time.monotonic() < deadline, statuses()
            assert not running.done()
            await asyncio.sleep(0.1)
        status = statuses()["1"]
        assert isinstance(status, Offline)
        assert "a bug in client 1" in status.reason
        assert list(fleet.failed) == ["1"]
        assert "RuntimeError" in fleet.failed["1"]
        await asyncio.sleep(1.0)
        assert not running.done()  # the other two still wait for their rounds
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
