"""Clients that fetch the broadcast only when they use it (FedAvg with ``federation.evaluate
= "when_trained"``), as real processes on a broker that keeps nothing across a restart.

A client chosen for round t fetches the broker's retained copy of round t-1's broadcast
and trains once it is applied. The broker restarts between two rounds and loses every
retained message; the coordinator, back on it, publishes the newest broadcast again, so a
client chosen next that did not train the round before still trains and uploads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import Federation

pytestmark = pytest.mark.slow

ON_DEMAND = [
    "method=fedavg",
    "federation.evaluate=when_trained",
    "federation.fraction=0.5",
    "federation.min_clients=2",
    "federation.round_timeout_s=40",
    "federation.pace_s=20",  # room between two rounds for the restart
    "logging.level=debug",
]


def test_a_broker_that_lost_the_retained_broadcast_still_serves_the_clients_chosen_next(
    tmp_path: Path,
) -> None:
    rounds = 4
    with (
        LocalBroker(tmp_path / "broker") as broker,  # no persistence: a restart forgets all
        Federation(tmp_path, broker, clients=4, rounds=rounds, overrides=ON_DEMAND) as fed,
    ):
        fed.start()
        fed.wait_for(
            lambda: any(e["round"] == 2 for e in fed.events(event="round.closed")),
            timeout=180,
            what="round 2 to close",
        )
        assert not fed.started(3)  # the restart falls between rounds 2 and 3
        broker.stop()
        time.sleep(1.0)
        broker.start()
        summary = fed.finish(timeout=240)

    assert summary["rounds_completed"] == rounds
    chosen = {t: set(fed.started(t)[-1]["selected"]) for t in range(1, rounds + 1)}
    assert chosen[3] - chosen[2], chosen  # someone chosen for round 3 must fetch round 2's
    assert summary["missing_uploads"] == 0  # every client chosen trained and uploaded
    assert [len(fed.started(t)) for t in range(1, rounds + 1)] == [1] * rounds  # no retries
    for client in sorted(chosen[3] - chosen[2]):
        waited = [e for e in fed.events(client, "training.waiting") if e["round"] == 3]
        assert waited, client  # it fetched the round before its own, and then trained
        assert any(e["round"] == 3 for e in fed.events(client, "upload.sent")), client
