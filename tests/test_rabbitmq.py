"""The federation end to end on a second broker that clusters: RabbitMQ's MQTT plugin.

Two RabbitMQ nodes on loopback form a cluster; the coordinator connects to one, the
clients to the other, so every message crosses the cluster. One client is SIGKILLed
mid-run: its last will (published by the other node) still ends the wait for it.
These tests run wherever Debian's rabbitmq-server is installed (.ci/run installs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import Federation
from tests.rabbit import RabbitNode, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.rabbitmq,
    pytest.mark.skipif(not available(), reason="rabbitmq-server is not installed"),
]


def test_a_federation_runs_across_a_two_node_rabbitmq_cluster(
    broker: LocalBroker, tmp_path: Path
) -> None:
    first = RabbitNode(tmp_path / "rabbit", "mqttfl-a")
    second = RabbitNode(tmp_path / "rabbit", "mqttfl-b")
    try:
        first.start()
        second.start()
        second.join(first)
        assert second.node in first.ctl("cluster_status")
        fed = Federation(
            tmp_path / "fed",
            broker,  # unused: every process talks to RabbitMQ
            clients=3,
            rounds=4,
            broker_url=first.url,
            overrides=["federation.round_timeout_s=40", "federation.min_clients=1"],
            client_brokers=dict.fromkeys(("0", "1", "2"), second.url),
        )
        with fed:
            fed.start()
            fed.wait_round_closed(2, timeout=180)
            fed.kill("2")
            summary = fed.finish(timeout=240)
    finally:
        second.stop()
        first.stop()
    assert summary["rounds_completed"] == 4
    assert summary["rejections"] == {}
    assert set(summary["clients"]) >= {"0", "1"}
    gone = [e for e in fed.events(event="client.offline") if e["client"] == "2"]
    assert gone
    assert gone[0]["reason"] == "connection lost"
    assert fed.stalled_rounds() == []
    print("FIGURES rabbitmq", json.dumps({"cluster_nodes": 2, "rounds": 4, "will_delivered": True}))
