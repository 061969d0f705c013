"""One hostile device with valid credentials against a training federation .

A Mosquitto from `broker init` (locked: a password and an ACL per identity) on
127.0.0.1, a 3-client federation of real processes (TinyConvNet4, tiny shards), and a
flood from a fourth process holding client 2's credentials (paho, in a thread):

- ``status``: online/offline status flips, each online with a different ``arch``
  (retained, as a device announces itself), 2,000/s for 40 s;
- ``uploads``: uploads for past and future rounds (the flood follows the round starts),
  1,000/s for 90 s, with a round deadline of 30 s.

Measured: the coordinator's RSS (VmRSS every 0.2 s) before the flood, its peak during
it and after it; honest uploads lost (an upload a client logged as sent that the
coordinator never accepted, in the rounds that closed); the longest round (first start
to close); rounds closed past their deadline; what the coordinator named throttled.
Goals: no honest upload lost, no round past its deadline, peak RSS <= 200 MB, back
under 120 MB after the flood.

    python -m benchmarks.bench_hostile_peer [--quick]     # --quick: 10 s floods
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks.common import WORK, bench_main, event_time, log
from mqttfl.config import load_config
from mqttfl.provisioning.broker_init import BrokerSetup, init_broker
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.wire import Message, encode
from mqttfl.wire.control import Offline, Online, RunStatus, read_run_status
from mqttfl.wire.schemas import ClientInfo
from tests.faults import RUN_ID, Federation, Witness

CLIENTS = ("0", "1", "2")
ATTACKER = "2"  # whose credentials the flood uses (client 2 keeps training meanwhile)
BASE = f"mqttfl/{RUN_ID}"
PEAK_GOAL_MB, AFTER_GOAL_MB = 200.0, 120.0
SETTLE_S = 10.0  # after the flood: the RSS "after" is the median of this window's samples

Message_ = tuple[str, bytes, bool]  # topic, payload, retain


@dataclass(frozen=True)
class Attack:
    name: str  # "status" or "uploads"
    rate: float  # messages a second
    seconds: float
    round_timeout_s: float


FULL = {
    "status": Attack("status", 2000.0, 40.0, 10.0),
    "uploads": Attack("uploads", 1000.0, 90.0, 30.0),
}


def quick_attack(attack: Attack, seconds: float = 10.0) -> Attack:
    return Attack(attack.name, attack.rate, seconds, attack.round_timeout_s)


class Flood(threading.Thread):
    """Publish ``make(i)`` at ``rate`` a second for ``seconds`` (QoS 1), as one client."""

    def __init__(
        self,
        port: int,
        env: dict[str, str],
        make: Callable[[int, int], Message_],
        *,
        rate: float,
        seconds: float,
        current_round: int = 1,
    ) -> None:
        super().__init__(daemon=True, name="flood")
        self.make, self.rate, self.seconds = make, rate, seconds
        self.sent = 0
        self.elapsed = 0.0
        self.current_round = current_round  # the newest round start seen (a device can read it)
        self.connected = threading.Event()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"hostile-{os.getpid()}-{time.time_ns()}"
        )
        self.client.username_pw_set(env["MQTTFL_BROKER__USERNAME"], env["MQTTFL_BROKER__PASSWORD"])
        self.client.max_inflight_messages_set(100)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        if not self.connected.wait(10):
            raise RuntimeError("the hostile client could not connect")

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        client.subscribe(f"{BASE}/round/+/start", qos=1)
        self.connected.set()

    def _on_message(self, _c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        parts = message.topic.split("/")
        if len(parts) == 5 and parts[4] == "start" and parts[3].isdigit():
            self.current_round = max(self.current_round, int(parts[3]))

    def run(self) -> None:
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < self.seconds:
            due = int(self.rate * elapsed) + 1
            while self.sent < due:
                topic, payload, retain = self.make(self.sent, self.current_round)
                self.client.publish(topic, payload, qos=1, retain=retain)
                self.sent += 1
            time.sleep(0.005)
        self.elapsed = time.monotonic() - began

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def status_flips(i: int, _round: int) -> Message_:
    """Online with a new ``arch`` each time, then offline: 1 KB a distinct announcement
    in a cache without a bound."""
    if i % 2:
        return f"{BASE}/status/{ATTACKER}", Offline(ATTACKER, "flip").encode(RUN_ID), True
    info = ClientInfo(ATTACKER, f"arch-{i}", (0, 1, 2), 60, (24, 242))
    return f"{BASE}/status/{ATTACKER}", Online(info).encode(RUN_ID), True


def wrong_rounds(num_classes: int, embed_dim: int) -> Callable[[int, int], Message_]:
    """Well-formed uploads for rounds the coordinator is not in (row 2)."""
    rng = np.random.default_rng(0)
    body = {
        "classes": np.arange(num_classes, dtype=np.int64),
        "prototypes": rng.standard_normal((num_classes, embed_dim)).astype(np.float32),
    }

    def make(i: int, current: int) -> Message_:
        # two rounds ahead at least: the round after this one may open before we see it
        past = current > 1 and i % 2 == 0
        t = random.randint(1, current - 1) if past else current + 2 + i % 50
        payload = encode(Message("upload", RUN_ID, t, ATTACKER, body))
        return f"{BASE}/round/{t}/up/{ATTACKER}", payload, False

    return make


class RssSampler(threading.Thread):
    """VmRSS of one process every ``interval`` seconds: (monotonic time, MB)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True, name="rss")
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            mb = status_mb(self.pid, "VmRSS")
            if mb is not None:
                self.samples.append((time.monotonic(), mb))
            self.stop.wait(self.interval)

    def between(self, start: float, end: float) -> list[float]:
        return [mb for at, mb in self.samples if start <= at <= end]


def status_mb(pid: int, key: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def secured(root: Path) -> tuple[BrokerSetup, LocalBroker]:
    setup = init_broker(root / "broker-setup", list(CLIENTS), run_id=RUN_ID, port=free_port())
    running = LocalBroker(root / "broker", port=setup.port, conf=setup.conf.read_text())
    return setup, running.start()


def honest_losses(fed: Federation, closed: set[int]) -> dict[str, list[int]]:
    """Per client: rounds (closed ones) whose upload it sent and the coordinator never took."""
    accepted = {(int(e["round"]), str(e["client"])) for e in fed.events(event="upload.accepted")}
    return {
        cid: sorted(
            t for t in set(fed.uploads_sent(cid)) if t in closed and (t, cid) not in accepted
        )
        for cid in CLIENTS
    }


def round_seconds(fed: Federation) -> dict[int, float]:
    """First start to close, per closed round."""
    out = {}
    for t, closes in fed.closed_rounds().items():
        starts = fed.started(t)
        if starts:
            out[t] = event_time(closes[-1]) - event_time(starts[0])
    return out


def retained_state(setup: BrokerSetup) -> RunStatus | None:
    """The run state the coordinator keeps retained, as `mqttfl watch` reads it."""
    env = setup.env("watch")
    witness = Witness(
        setup.port,
        [f"{BASE}/state"],
        username=env["MQTTFL_BROKER__USERNAME"],
        password=env["MQTTFL_BROKER__PASSWORD"],
    )
    with witness:
        time.sleep(1.0)
        found = witness.seen(lambda m: bool(m.payload))
    return read_run_status(found[-1].payload, run_id=RUN_ID) if found else None


def run_attack(
    root: Path, attack: Attack, *, rounds_after: int = 2, settle_s: float = SETTLE_S
) -> dict[str, Any]:
    """The federation under one attack; its figures (see the module's docstring)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    setup, broker = secured(root)
    overrides = [
        f"federation.round_timeout_s={attack.round_timeout_s}",
        "federation.final_metrics_timeout_s=10",
    ]
    config = load_config(
        "configs/fedapa-csi.toml", ["method=fedapa", *overrides, "model.name=tiny"]
    )
    make: Callable[[int, int], Message_] = status_flips
    if attack.name == "uploads":
        make = wrong_rounds(config.model.num_classes, config.model.embed_dim)
    fed = Federation(
        root / "fed", broker, clients=3, rounds=100_000, overrides=overrides, broker_url=setup.url
    )
    try:
        with fed:
            fed.start_coordinator(env=setup.env("coordinator"))
            for cid in CLIENTS:
                fed.start_client(cid, env=setup.env(cid))
            fed.wait_round_closed(2, timeout=240)
            sampler = RssSampler(fed.pid("coordinator"))
            sampler.start()
            time.sleep(3.0)
            first_round = fed.last_closed() + 1
            flood = Flood(
                setup.port,
                setup.env(ATTACKER),
                make,
                rate=attack.rate,
                seconds=attack.seconds,
                current_round=first_round,
            )
            began = time.monotonic()
            log(f"{attack.name}: {attack.rate:.0f}/s for {attack.seconds:.0f} s")
            flood.start()
            flood.join(timeout=attack.seconds + 60)
            flood.close()
            ended = time.monotonic()
            last_in_flood = fed.last_closed()
            fed.wait_round_closed(last_in_flood + rounds_after, timeout=attack.round_timeout_s * 4)
            time.sleep(settle_s)
            after = sampler.between(time.monotonic() - settle_s, time.monotonic())
            sampler.stop.set()
            peak_hwm = status_mb(fed.pid("coordinator"), "VmHWM")
            closed = set(fed.closed_rounds())
            seconds = round_seconds(fed)
            during = {t: s for t, s in seconds.items() if t >= first_round}
            throttled = fed.events(event="client.throttled")
            coordinator_alive = fed.alive("coordinator")
            events = fed.events()
            state = retained_state(setup)
    finally:
        broker.stop()
    before = sampler.between(began - 3.0, began)
    in_flood = sampler.between(began, ended + settle_s)
    losses = honest_losses(fed, closed)
    counts: dict[str, int] = {}
    for e in events:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    lost = {cid: len(rounds) for cid, rounds in losses.items()}
    peak = round(max(in_flood), 1) if in_flood else None
    rss_after = round(float(np.median(after)), 1) if after else None
    stalled = fed.stalled_rounds()
    figures: dict[str, Any] = {
        "attack": attack.__dict__,
        "flood_sent": flood.sent,
        "flood_rate_per_s": round(flood.sent / max(flood.elapsed, 1e-9), 1),
        "rss_before_mb": round(float(np.median(before)), 1) if before else None,
        "rss_peak_mb": peak,
        "rss_after_mb": rss_after,
        "rss_hwm_mb": round(peak_hwm, 1) if peak_hwm is not None else None,
        "honest_uploads_lost": lost,
        "honest_uploads_lost_rounds": losses,
        "rounds_during_and_after_flood": len(during),
        "longest_round_s": round(max(during.values()), 2) if during else None,
        "rounds_past_deadline": stalled,
        "throttled": [(e["client"], e["budget"]) for e in throttled],
        "state_throttled": list(state.throttled) if state is not None else None,
        "coordinator_alive": coordinator_alive,
        "log_lines": {
            k: counts.get(k, 0)
            for k in (
                "upload.rejected",
                "upload.late",
                "message.rejected",
                "client.online",
                "client.offline",
                "messages.held_back",
            )
        },
    }
    figures["goals"] = {
        "no_honest_upload_lost": sum(lost.values()) == 0,
        "no_round_past_deadline": not stalled,
        "peak_le_200mb": peak is not None and peak <= PEAK_GOAL_MB,
        "after_lt_120mb": rss_after is not None and rss_after < AFTER_GOAL_MB,
    }
    log(f"{attack.name}: {figures}")
    return figures


def run(quick: bool) -> dict[str, Any]:
    attacks = {name: quick_attack(a) if quick else a for name, a in FULL.items()}
    return {name: run_attack(WORK / f"hostile-{name}", attack) for name, attack in attacks.items()}


if __name__ == "__main__":
    bench_main("hostile_peer", (__doc__ or "").splitlines()[0], run)
