"""[privacy] across kills and resets, with real processes on a real Mosquitto: a round's
noised upload leaves the device once (a restarted client sends the same bytes again),
the coordinator holds an identity to its budget by its own count (a device that wiped
its state gets no fresh budget), and a run whose clients have spent their budgets ends
with its summary, saying so."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from mqttfl.privacy.accountant import epsilon_spent
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from tests.faults import RUN_ID, Federation, Witness, read_events, timestamp, topic_parts

pytestmark = pytest.mark.slow

Z = 0.8
DP = ["privacy.enabled=true", "privacy.clip=1.0", f"privacy.noise_multiplier={Z}"]


def releases_by_round(witness: Witness, client: str) -> dict[int, set[bytes]]:
    """The distinct payloads ``client`` put on the bus for each round."""
    found: dict[int, set[bytes]] = defaultdict(set)
    for seen in witness.seen():
        parts = topic_parts(seen.topic)
        if parts[0] == "round" and parts[2] == "up" and parts[3] == client and seen.payload:
            found[int(parts[1])].add(seen.payload)
    return found


def test_a_restarted_client_sends_its_noised_upload_again_byte_for_byte(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """Coordinator and client 0 killed while round 2 is open (client 0 has released its
    upload, client 1 is stopped): both restart, client 0 sends round 2 again. Every round
    has one release of client 0 on the bus, and the coordinator counts exactly those."""
    fed = Federation(
        tmp_path,
        broker,
        clients=2,
        rounds=3,
        overrides=[
            *DP,
            "federation.min_clients=2",
            "federation.ack_timeout_s=60",
            "federation.round_timeout_s=60",
        ],
    )
    up = Topics(RUN_ID).up(0, "0").replace("/round/0/", "/round/+/")
    with Witness(broker.port, [up]) as witness, fed:
        fed.start()
        fed.wait_for(lambda: 1 in fed.uploads_sent("1"), timeout=120, what="client 1's upload")
        fed.stop("1")  # round 1 closes with its upload; round 2 stays open, waiting for it
        fed.wait_round_closed(1, timeout=120)
        fed.wait_for(
            lambda: 2 in fed.uploads_sent("0") and releases_by_round(witness, "0").get(2),
            timeout=60,
            what="client 0's round-2 upload on the bus",
        )
        time.sleep(0.5)  # its state write after the send (background) is done
        fed.kill("coordinator")
        fed.kill("0")
        fed.restart("coordinator")
        fed.restart("0")
        fed.cont("1")
        summary = fed.finish(timeout=180)
        witness.stop()
    releases = releases_by_round(witness, "0")
    assert all(len(payloads) == 1 for payloads in releases.values()), {
        t: len(p) for t, p in releases.items()
    }
    assert sorted(releases) == [1, 2, 3]
    # (sent again for the killed coordinator's retained start, and for the new one's)
    resent = [e for e in read_events(fed.logs / "client-0.jsonl") if e["event"] == "upload.resent"]
    assert {e["round"] for e in resent} == {2}
    assert summary["privacy"]["uploads"]["0"] == len(releases)
    assert summary["privacy"]["epsilon"]["0"] == pytest.approx(epsilon_spent(Z, 3, 1e-5))


def test_a_reset_device_gets_no_fresh_budget_and_spent_budgets_end_the_run(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """A budget of two uploads. Client 0 is killed after round 1 and restarted with its
    state dir wiped: its device counts from zero again, the coordinator does not. No
    identity uploads past its budget, and once none can upload the run ends at once with
    summary.json saying why, rather than retrying rounds until it fails."""
    budget = epsilon_spent(Z, 2, 1e-5) * 1.0001
    fed = Federation(
        tmp_path,
        broker,
        clients=2,
        rounds=5,
        overrides=[*DP, f"privacy.epsilon={budget}", "federation.min_clients=1"],
    )
    with fed:
        fed.start()
        fed.wait_round_closed(1, timeout=120)
        fed.kill("0")
        # client 0's device is reset: it remembers no upload (client 1 runs on, writing its
        # own state beside it, so only client 0's files go)
        wiped = list(fed.state_dir.glob("*/client-0.*"))
        assert wiped
        for path in wiped:
            path.unlink()
        fed.restart("0")
        summary = fed.finish(timeout=240)
    privacy = summary["privacy"]
    assert all(count <= 2 for count in privacy["uploads"].values()), privacy["uploads"]
    assert all(eps <= budget for eps in privacy["epsilon"].values()), privacy["epsilon"]
    assert summary["rounds_completed"] < 5
    assert summary["ended_early"].startswith("privacy budgets spent after round")
    # It ended at once, not after round deadlines of retries nobody could answer.
    ending = fed.events("coordinator", "run.ending")
    assert [e["reason"] for e in ending] == ["privacy budgets spent"]
    last_closed = fed.events("coordinator", "round.closed")[-1]
    assert timestamp(ending[0]) - timestamp(last_closed) < fed.round_timeout_s
    # Every client, the reset one too, took the early end as the run's end (exit 0).
    assert [e["round"] for e in fed.events("0", "run.finishing")][-1:] == [
        summary["rounds_completed"]
    ]
