"""Fan-in: 100 devices upload in the same instant; nothing is dropped.

The devices are simulated by the LOAD client (mqttfl.testing.loadclient: no model, no
training), one process with 100 MQTT sessions; the coordinator and the broker are real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import RUN_ID, Federation, Seen, Witness, topic_parts, uploads_on_the_wire

DROPPED = "$SYS/broker/publish/messages/dropped"


pytestmark = pytest.mark.slow


def test_fan_in_of_100_simultaneous_uploads(broker: LocalBroker, tmp_path: Path) -> None:
    n, rounds = 100, 2
    with (
        Federation(
            tmp_path,
            broker,
            clients=n,
            rounds=rounds,
            overrides=[
                "model.embed_dim=16",
                "federation.round_timeout_s=30",
                "federation.final_metrics_timeout_s=10",
            ],
        ) as fed,
        Witness(
            broker.port,
            [DROPPED, f"mqttfl/{RUN_ID}/round/+/up/+", f"mqttfl/{RUN_ID}/round/+/down/+"],
        ) as witness,
    ):
        fed.start_coordinator()
        fed.start_load(n)
        summary = fed.finish(timeout=120)
        time.sleep(1.5)  # one more $SYS interval

    closed = fed.closed_rounds()
    assert sorted(closed) == list(range(1, rounds + 1))
    for t in range(1, rounds + 1):
        assert closed[t][0]["uploads"] == n
        assert closed[t][0]["missing"] == []
    wire = uploads_on_the_wire(witness)
    accepted = [k for k, v in fed.outcomes().items() if v == ["accepted"]]
    assert len(wire) == n * rounds
    assert set(wire.values()) == {1}
    assert sorted(accepted) == sorted(wire)  # every upload on the wire was accepted, once
    dropped = [int(m.payload) for m in witness.seen(lambda m: m.topic == DROPPED)]
    assert dropped
    assert set(dropped) == {0}
    assert summary["rejections"] == {}
    assert summary["missing_uploads"] == 0
    # FedAPA's bounded downlink (k=8 < N-1): a client receives S (k+1 sets) in the
    # broadcast and Q_i plus its own set in its personal one, for any N; P of all N sets
    # would be N·C·d·4 = 134 KB here.
    k, c, d = 8, 21, 16
    bound = (k + 3) * c * d * 4 + 2048 + 10 * n  # the sets, framing, the broadcast's id list
    for t in range(1, rounds + 1):

        def downlink(m: Seen, t: int = t) -> bool:
            return topic_parts(m.topic)[:3] == ["round", str(t), "down"]

        down = witness.seen(downlink)
        broadcast = [len(m.payload) for m in down if m.topic.endswith("/all") and m.payload]
        personal = [len(m.payload) for m in down if not m.topic.endswith("/all")]
        assert len(broadcast) == 1
        assert len(personal) == n
        assert broadcast[0] + max(personal) <= bound < n * c * d * 4
    first = [m.at for m in witness.seen(lambda m: topic_parts(m.topic)[:3] == ["round", "1", "up"])]
    spread = max(first) - min(first)
    print(
        "FIGURES fan-in",
        json.dumps(
            {
                "clients": n,
                "uploads": sum(wire.values()),
                "dropped": max(dropped),
                "round1_upload_spread_s": round(spread, 3),
            }
        ),
    )
