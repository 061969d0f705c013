"""Large uploads at scale through a 128 KiB broker: nothing is lost, nobody is told nothing.

40 and 200 simulated devices (the torch-free load client, one process) upload FedAvg
weights of LargeConvNet4 (1.86 MB, 15 chunks each) at the same instant through a
Mosquitto with ``max_packet_size 131072``; their chunks interleave at the coordinator.
Every round must close with every upload. In the 40-device run a flooder (its own
client id) starts hundreds of partial messages meanwhile: it is bounded and counted, and
no honest upload is lost to it; and a stray chunk on one device's upload topic, sent the
moment that device's first chunk crosses the broker, breaks that upload at the
coordinator: the device is told, and sends it again within the round.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqttfl.provisioning.local_broker import LOCAL_CONF, LocalBroker
from mqttfl.wire.chunks import payload_budget, split
from tests.faults import RUN_ID, Federation, Seen, Witness, read_events

pytestmark = pytest.mark.slow

LIMIT = 131_072
FLOOD_MESSAGES = 300
VICTIM = "load005"


class Stray:
    """Publishes one stray first chunk on the victim's topic the moment its first chunk
    of round 1 crosses the broker (so it lands in the middle of the victim's message)."""

    def __init__(self, port: int) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="stray")
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        self.sent = threading.Event()

    def on_message(self, seen: Seen) -> None:
        if not self.sent.is_set():
            self.sent.set()
            stray = split(bytes(1_800_000), payload_budget(LIMIT, seen.topic))[0]
            self.client.publish(seen.topic, stray, qos=1)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _flood(port: int, stop: threading.Event, sent: list[int]) -> None:
    """First chunks of ever new 1.8 MB messages on the flooder's own upload topics."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="flooder")
    client.connect("127.0.0.1", port, keepalive=10)
    client.loop_start()
    try:
        payload = bytes(1_800_000)
        for index in range(FLOOD_MESSAGES):
            if stop.is_set():
                break
            topic = f"mqttfl/{RUN_ID}/round/{1 + index % 3}/up/flood"
            first = split(payload, payload_budget(LIMIT, topic))[0]
            client.publish(topic, first, qos=1).wait_for_publish(timeout=10)
            sent.append(index)
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.mark.parametrize("n", [40, 200])
def test_interleaved_fedavg_uploads_lose_nothing(tmp_path: Path, n: int) -> None:
    rounds = 2
    conf = LOCAL_CONF.replace("max_packet_size 67108864", f"max_packet_size {LIMIT}")
    overrides = [
        "method=fedavg",
        "model.name=large",
        f"broker.max_message_bytes={LIMIT}",
        f"federation.min_clients={n}",
        "federation.round_timeout_s=240",
        "federation.final_metrics_timeout_s=30",
    ]
    stop, flooded = threading.Event(), list[int]()
    with (
        LocalBroker(tmp_path / "broker", conf=conf) as broker,
        Federation(tmp_path / "fed", broker, clients=n, rounds=rounds, overrides=overrides) as fed,
    ):
        stray = Stray(broker.port)
        victim = f"mqttfl/{RUN_ID}/round/1/up/{VICTIM}"
        witness = Witness(broker.port, [victim], on_message=stray.on_message)
        if n == 40:
            witness.start()
        fed.start_coordinator()
        fed.start_load(n, extra=["--upload", "weights"])
        flooder = None
        if n == 40:
            fed.wait_round_started(1, timeout=120)
            flooder = threading.Thread(target=_flood, args=(broker.port, stop, flooded))
            flooder.start()
        try:
            summary = fed.finish(timeout=900)
        finally:
            stop.set()
            if flooder is not None:
                flooder.join(timeout=30)
            if n == 40:
                witness.stop()
            stray.close()

    closed = fed.closed_rounds()
    assert sorted(closed) == list(range(1, rounds + 1))
    for t in range(1, rounds + 1):
        (close,) = closed[t]
        assert close["uploads"] == n, close
        assert close["missing"] == [], close
    accepted = [k for k, v in fed.outcomes().items() if "accepted" in v]
    lost = n * rounds - len(accepted)
    assert lost == 0
    assert summary["rejections"] == {}
    assert summary["missing_uploads"] == 0
    asked = fed.events(event="upload.resend_asked")
    given_up = [
        e
        for e in fed.events(event="message.rejected")
        if str(e["reason"]).startswith("chunk") and not e["topic"].endswith("/flood")
    ]
    resent = [e for e in read_events(fed.logs / "load.jsonl") if e["event"] == "upload.resent"]
    if n == 40:
        # The flooder: bounded to one message at a time, each one given up on counted, or
        # past its sender's budget dropped before reassembly and counted as throttled
        # its partial messages took no room from the round's uploads.
        assert len(flooded) > 50
        rejected = summary["rejected_messages"]
        counted = rejected.get("chunk_incomplete", 0) + rejected.get("throttled", 0)
        assert counted >= len(flooded) - 1
        assert "chunk_busy" not in summary["rejected_messages"]
        # The broken upload: its device was asked, and sent it again within round 1.
        assert stray.sent.is_set()
        assert {(e["round"], e["client"]) for e in asked} == {(1, VICTIM)}
        assert [(e["round"], e["client_id"]) for e in resent] == [(1, VICTIM)]
    else:
        assert given_up == []
        assert asked == []
        assert resent == []
    print(
        "FIGURES chunks-at-scale",
        json.dumps(
            {
                "senders": n,
                "rounds": rounds,
                "uploads_accepted": len(accepted),
                "lost": lost,
                "resend_asked": len(asked),
                "resent": len(resent),
                "honest_partials_given_up": len(given_up),
                "flood_messages": len(flooded),
                "rejected_messages": summary["rejected_messages"],
            }
        ),
    )
