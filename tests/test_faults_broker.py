"""Broker restart: Mosquitto stops and starts again mid-round; everyone reconnects."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiomqtt
import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import RUN_ID, Federation, Witness, uploads_on_the_wire

pytestmark = pytest.mark.slow

BROKER_DOWN_S = 2.0


def test_broker_restart_mid_round_every_party_reconnects(tmp_path: Path) -> None:
    rounds, n = 4, 3
    # Client 0 trains for much longer than the others, so it is still training when
    # everyone is back: the coordinator must wait for its upload, not close the round
    # as soon as the broker returns.
    with (
        LocalBroker(tmp_path / "broker", persistence=True) as broker,
        Federation(
            tmp_path,
            broker,
            clients=n,
            rounds=rounds,
            overrides=[
                "federation.round_timeout_s=60",
                'federation.device_keys=["train.local_epochs"]',  # a device's own pace
            ],
            client_overrides={"0": ["train.local_epochs=25"]},
        ) as fed,
    ):
        fed.start()
        fed.wait_round_started(3, timeout=180)
        # Down long enough for the reconnect backoff to grow; same port after; retained
        # state and statuses survive (persistence).
        broker.stop()
        time.sleep(BROKER_DOWN_S)
        broker.start()
        with Witness(broker.port, [f"mqttfl/{RUN_ID}/round/+/up/+"]) as witness:
            summary = fed.finish(timeout=180)

    assert summary["rounds_completed"] == rounds
    closed = fed.closed_rounds()
    assert sorted(closed) == list(range(1, rounds + 1))
    assert all(len(v) == 1 for v in closed.values())
    assert fed.stalled_rounds() == []
    for name in ["coordinator", *map(str, range(n))]:
        bus = [e for e in fed.events(name) if e["event"].startswith("broker.")]
        assert [e["event"] for e in bus][:2] == ["broker.connected", "broker.disconnected"], name
        assert max(e.get("connections", 0) for e in bus) == 2, (
            name
        )  # reconnected once, with backoff
        retries = [
            e["retry_in_s"]
            for e in bus
            if e["event"] in ("broker.disconnected", "broker.unreachable")
        ]
        assert retries == sorted(retries), name  # the backoff grows while the broker is away
    # Nothing was lost to the restart: every selected client of every round was aggregated.
    assert summary["missing_uploads"] == 0, list(fed.events(event="upload.missing"))
    # A round started while a client was still reconnecting selects only the live ones.
    for e in fed.events(event="round.closed"):
        assert e["uploads"] == len(fed.started(e["round"])[-1]["selected"]), e
    # An upload that crossed the restart can arrive twice: the client sent it again, or the
    # broker redelivered a QoS 1 message whose acknowledgement the restart cut off (at most
    # one in flight per client). The copy is rejected as a duplicate, never aggregated twice.
    assert set(summary["rejections"]) <= {"duplicate"}
    resent = sum(len(fed.events(cid, "upload.resent")) for cid in map(str, range(n)))
    assert summary["rejections"].get("duplicate", 0) <= resent + n
    wire = uploads_on_the_wire(witness)  # from the restart on
    verdicts = fed.outcomes()
    assert all(
        len([v for v in verdicts[key] if v != "missing"]) >= count for key, count in wire.items()
    )
    print(
        "FIGURES broker-restart",
        json.dumps(
            {"broker_restarts_survived": 1, "rounds": rounds, "stalled": len(fed.stalled_rounds())}
        ),
    )


async def _receive_one(port: int, identifier: str, topic: str, timeout: float) -> bytes | None:
    """Reconnect a persistent session and return the first message queued for it."""
    async with aiomqtt.Client(
        "127.0.0.1", port, identifier=identifier, clean_session=False
    ) as client:
        try:
            async with asyncio.timeout(timeout):
                async for message in client.messages:
                    if message.topic.matches(topic):
                        return bytes(message.payload)
        except TimeoutError:
            return None
    return None


def test_local_broker_keeps_queued_messages_across_a_restart(tmp_path: Path) -> None:
    """A QoS 1 message queued for an offline persistent session survives the broker's
    restart (run as root, mosquitto used to drop to a user that could not write its
    persistence file, and lost the queue)."""
    topic, identifier = "mqttfl/t/round/1/up/0", "persistent-subscriber"

    async def subscribe_then_leave(port: int) -> None:
        async with aiomqtt.Client(
            "127.0.0.1", port, identifier=identifier, clean_session=False
        ) as client:
            await client.subscribe(topic, qos=1)

    async def publish(port: int) -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier="publisher") as client:
            await client.publish(topic, b"upload", qos=1)

    with LocalBroker(tmp_path / "broker", persistence=True) as broker:
        asyncio.run(subscribe_then_leave(broker.port))
        asyncio.run(publish(broker.port))  # queued: the subscriber is offline
        broker.restart()
        assert broker.log_path.stat().st_size > 0  # mosquitto could write in its work dir
        assert asyncio.run(_receive_one(broker.port, identifier, topic, timeout=10)) == b"upload"
