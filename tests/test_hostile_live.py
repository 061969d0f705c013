"""Hostile input: the catalogue (tests/hostile.py) against the gate, and a LIVE replay.

In-process: every catalogue entry is rejected by the upload gate with its reason and
counted (fuzzing is tests/test_hostile_fuzz.py). Live: the whole catalogue is fired over
a real broker at a real coordinator mid-run; the run completes, each shot is logged with
its reason, and summary.json's rejections equal the catalogue's reasons.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqttfl.config import load_config
from mqttfl.engine.gate import UploadGate
from mqttfl.errors import RejectedUpload
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import decode
from mqttfl.wire.control import Offline, Online
from mqttfl.wire.schemas import ClientInfo
from tests.faults import RUN_ID, Federation, Witness
from tests.hostile import (
    CATALOGUE,
    CONTROL_CATALOGUE,
    INFO,
    SCENE,
    Scene,
    expected_rejections,
    fresh_gate,
)


def _fire(gate: UploadGate, scene: Scene, hostile_phase: str) -> list[tuple[str, str]]:
    results = []
    for hostile in (h for h in CATALOGUE if h.phase == hostile_phase):
        shot = hostile.shot(scene)
        try:
            gate.check(shot.round, shot.client, shot.payload, INFO.get(shot.client))
        except RejectedUpload as exc:
            results.append((hostile.name, exc.reason))
        else:
            results.append((hostile.name, "ACCEPTED"))
    return results


# --- the catalogue against the gate -------------------------------------------------------
def test_catalogue_covers_every_attack_named_in_the_issue() -> None:
    reasons = expected_rejections()
    for reason in (
        "malformed",
        "size",
        "dtype",
        "shape",
        "non_finite",
        "range",
        "stale",
        "future",
        "duplicate",
        "sender",
        "unknown_field",
        "type",
        "version",
        "oversize",
        "round_mismatch",
        "not_selected",
    ):
        assert reasons[reason] >= 1, reason
    assert len({h.name for h in CATALOGUE}) == len(CATALOGUE)


def test_catalogue_against_the_gate_every_shot_rejected_with_its_reason() -> None:
    gate = fresh_gate()
    got = _fire(gate, SCENE, "before")
    assert gate.accepted == {}
    gate.check(SCENE.round, "v", SCENE.valid(), INFO["v"])  # the one valid upload
    got += _fire(gate, SCENE, "after")
    uploads = gate.close_round()
    gate.open_round(SCENE.round + 1, ["v", "x"], keep=False)
    got += _fire(gate, SCENE, "closed")
    want = [
        (h.name, h.reason)
        for phase in ("before", "after", "closed")
        for h in CATALOGUE
        if h.phase == phase
    ]
    assert got == want
    assert gate.rejections == expected_rejections()
    assert [u.client_id for u in uploads] == ["v"]
    np.testing.assert_array_equal(
        uploads[0].body["prototypes"], decode(SCENE.valid()).body["prototypes"]
    )


# --- live: the catalogue over a real broker at a real coordinator --------------------------------
class Actor:
    """A hostile MQTT client (anonymous broker): announces fake devices and fires shots."""

    def __init__(self, port: int) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"actor-{time.time_ns()}")
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.slow
def test_catalogue_replayed_against_a_live_coordinator(broker: LocalBroker, tmp_path: Path) -> None:
    base = f"mqttfl/{RUN_ID}"
    max_bytes = 200_000
    with (
        Federation(
            tmp_path,
            broker,
            clients=2,
            rounds=3,
            overrides=[
                "method=fedapa",  # the catalogue is FedAPA's uploads (tests/hostile.py)
                "federation.num_clients=4",
                f"federation.max_upload_bytes={max_bytes}",
                "federation.round_timeout_s=20",
            ],
        ) as fed,
        Witness(broker.port, [f"{base}/round/+/down/all"]) as witness,
    ):
        config = load_config(fed.config, fed.all_overrides)
        scene = Scene(
            run_id=RUN_ID,
            round=1,
            victim="h1",
            unselected="h2",
            ghost="h9",
            num_classes=config.model.num_classes,
            embed_dim=config.model.embed_dim,
            max_upload_bytes=max_bytes,
        )
        actor = Actor(broker.port)
        info = {c: ClientInfo(c, "tiny", scene.classes, 96, (24, 242)) for c in ("h1", "h2", "h3")}
        try:
            for cid in ("h1", "h3"):  # h3 holds the round open until the 'after' shots are in
                actor.publish(f"{base}/status/{cid}", Online(info[cid]).encode(RUN_ID), retain=True)
            fed.start_coordinator()
            fed.start_client("0")
            fed.start_client("1")
            start = fed.wait_round_started(1, timeout=120)
            assert {"h1", "h3"} <= set(start["selected"])
            actor.publish(f"{base}/status/h2", Online(info["h2"]).encode(RUN_ID), retain=True)
            fed.wait_for(
                lambda: fed.events(event="client.online")[-1]["client"] == "h2",
                timeout=20,
                what="h2 online",
            )

            def verdicts() -> int:
                return sum(
                    1 for e in fed.events() if e["event"] in ("upload.rejected", "upload.late")
                )

            def fire(phase: str) -> None:
                shots = [h.shot(scene) for h in CATALOGUE if h.phase == phase]
                before = verdicts()
                for shot in shots:
                    actor.publish(f"{base}/round/{shot.round}/up/{shot.client}", shot.payload)
                fed.wait_for(
                    lambda: verdicts() >= before + len(shots), timeout=30, what=f"{phase} verdicts"
                )

            fire("before")
            for topic, payload, _ in CONTROL_CATALOGUE(scene):
                actor.publish(f"{base}/{topic}", payload)
            actor.publish(f"{base}/round/1/up/h1", scene.valid())
            fire("after")
            actor.publish(f"{base}/round/1/up/h3", scene.upload(sender="h3"))
            for cid in ("h1", "h2", "h3"):
                actor.publish(
                    f"{base}/status/{cid}",
                    Offline(cid, "exit").encode(RUN_ID),
                    retain=True,
                )
            fed.wait_round_started(2, timeout=60)
            fire("closed")
            summary = fed.finish(timeout=120)
        finally:
            actor.close()

    assert summary["rounds_completed"] == 3  # the coordinator never crashed
    assert summary["rejections"] == dict(expected_rejections())
    logged = Counter(
        e["reason"] for e in fed.events() if e["event"] in ("upload.rejected", "upload.late")
    )
    assert logged == expected_rejections()
    control = Counter(reason for _, _, reason in CONTROL_CATALOGUE(scene))
    assert Counter(e["reason"] for e in fed.events(event="message.rejected")) == control
    assert summary["rejected_messages"] == dict(control)
    # Nothing poisoned reached aggregation: round 1 aggregated exactly the two real clients and
    # the two valid fake uploads, and h1's row of the padded prototypes is its valid upload.
    closed1 = fed.closed_rounds()[1][0]
    assert closed1["uploads"] == 4
    assert closed1["missing"] == []
    down = [
        decode(m.payload)
        for m in witness.seen(lambda m: m.topic.endswith("/round/1/down/all") and bool(m.payload))
    ]
    body = down[0].body
    assert body["_personal"] == ["0", "1", "h1", "h3"]
    assert np.isfinite(body["prototypes"]).all()
    valid = decode(scene.valid()).body
    np.testing.assert_array_equal(body["prototypes"][2][valid["classes"]], valid["prototypes"])
    print(
        "FIGURES hostile-live",
        json.dumps(
            {
                "bad_inputs_tried": len(CATALOGUE) + sum(control.values()),
                "coordinator_crashes": 0,
                "rejections": summary["rejections"],
                "rejected_messages": summary["rejected_messages"],
            }
        ),
    )
