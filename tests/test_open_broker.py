"""What a peer can do with the run's lease and a site's notice .

On an open (anonymous) broker anyone may publish anything; on one from `broker init` the
ACL decides who may write the lease (the coordinator's identity only) and a site's
notice (that site's bridge identity only). Rows, each as a real process on a real
Mosquitto on 127.0.0.1:

13. a retained forged ``live`` lease once kept every coordinator from starting (also
    with ``--clear-run``), naming a pid that never existed: now its holder is asked, and
    a lease nobody answers for by the time its last will would have fired is taken over;
14. a forged released lease while a coordinator ran let a second coordinator in, and
    both flapped (about 142 reconnects each in 60 s): now the live one restores its lease
    at once, a released lease is asked about as a live one is (so the second one is
    refused before it connects), and of two that take each other's session over, the
    later one stops;
15. a forged ``site/kitchen = 0`` at 10/s kept client 0 out of every round, silently:
    now only a change counts, a site takes its clients offline at most once every
    SITE_HOLD_S, it is logged, and a client is back as soon as it sends anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.config import load_config
from mqttfl.engine.sites import SITE_HOLD_S, SiteNotices
from mqttfl.errors import first_mqttfl_error
from mqttfl.nodes.coordinator import Coordinator as CoordinatorNode
from mqttfl.nodes.run_lease import LeaseGuard, claim_run, will_window
from mqttfl.provisioning.broker_init import init_broker
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.wire import Topics
from mqttfl.wire.control import RunStatus
from mqttfl.wire.lease import Lease, probe, read_lease
from tests.faults import CONFIG, RUN_ID, TINY, Federation, read_events, timestamp, wait_for
from tests.helpers import REPO, mqttfl, spawn

BASE = f"mqttfl/{RUN_ID}"
LEASE = f"{BASE}/lease"
KEEPALIVE_S = 4  # the will window is then 1.5 * 4 + 2 = 8 s
NOT_AUTHORIZED = 0x87
ACCEPTED = 0x80  # PUBACK reason codes below it are successes (0x10: no subscribers yet)


class Peer:
    """A plain MQTT 5 client (anonymous, or one identity of `broker init`)."""

    def __init__(self, port: int, env: dict[str, str] | None = None) -> None:
        self.acks: dict[int, Any] = {}
        self.retained: dict[str, bytes] = {}
        self._acked = threading.Condition()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"peer-{os.getpid()}-{time.time_ns()}",
            protocol=paho.MQTTv5,
        )
        if env:
            self.client.username_pw_set(
                env["MQTTFL_BROKER__USERNAME"], env["MQTTFL_BROKER__PASSWORD"]
            )
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        with self._acked:
            self.acks[mid] = reason
            self._acked.notify_all()

    def _on_message(self, _c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        if message.retain:
            self.retained[message.topic] = bytes(message.payload)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """The broker's PUBACK reason code (below 0x80: accepted, 0x87: not authorized)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        with self._acked:
            assert self._acked.wait_for(lambda: info.mid in self.acks, timeout=10)
            return int(self.acks[info.mid].value)

    def read_retained(self, topic: str) -> bytes | None:
        self.retained.pop(topic, None)
        self.client.subscribe(topic, qos=1)
        time.sleep(1.0)
        self.client.unsubscribe(topic)
        return self.retained.get(topic)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def peer(broker: LocalBroker) -> Iterator[Peer]:
    attacker = Peer(broker.port)
    yield attacker
    attacker.close()


def _settings(*extra: str) -> list[str]:
    sets = [
        *TINY,
        f"broker.keepalive_s={KEEPALIVE_S}",
        "federation.join_timeout_s=300",
        "federation.num_clients=3",
        *extra,
    ]
    return [arg for item in sets for arg in ("--set", item)]


class Coordinator:
    """`mqttfl coordinator` as its own process, with no clients (it waits for them)."""

    def __init__(self, root: Path, name: str, broker: LocalBroker, *extra: str) -> None:
        self.logs = root / f"logs-{name}"
        self.out = root / f"out-{name}"
        self.output = root / f"{name}.out"
        self.proc = spawn(
            "coordinator",
            "--config",
            CONFIG,
            "--broker",
            broker.url,
            "--out",
            str(self.out),
            *extra,
            *_settings(),
            log=self.output,
            env={"MQTTFL_LOG_DIR": str(self.logs)},
        )

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = read_events(self.logs / "coordinator.jsonl")
        return [e for e in found if name is None or e["event"] == name]

    def wait_started(self, timeout: float = 90) -> dict[str, Any]:
        def started() -> dict[str, Any] | None:
            assert self.proc.poll() is None, self.output.read_text()[-2000:]
            return next(iter(self.events("run.started")), None)

        event: dict[str, Any] = wait_for(started, timeout=timeout, what="the coordinator to start")
        return event

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# --- row 13 -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("clear", [False, True], ids=["start", "clear-run"])
def test_a_forged_live_lease_is_taken_over_when_its_holder_would_be_gone(
    clear: bool, broker: LocalBroker, peer: Peer, tmp_path: Path
) -> None:
    forged = Lease(True, "forged-host", 424242, time.time() - 60)
    assert peer.publish(LEASE, forged.encode(), retain=True) < ACCEPTED
    began = time.monotonic()
    coordinator = Coordinator(tmp_path, "c", broker, *(["--clear-run"] if clear else []))
    try:
        coordinator.wait_started()
        took = time.monotonic() - began
        [line] = coordinator.events("lease.taken_over")
        assert "pid 424242 on forged-host" in line["holder"]
        # It waited for the holder as long as the holder's last will could take, no longer.
        config = load_config(CONFIG, [f"broker.keepalive_s={KEEPALIVE_S}"])
        assert line["waited_s"] == pytest.approx(will_window(config), abs=0.1)
        assert will_window(config) <= took < will_window(config) + 45
        held = read_lease(peer.read_retained(LEASE) or b"")
        assert held.live
        assert held.pid == coordinator.proc.pid
    finally:
        coordinator.stop()


# --- row 14 -----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_forged_released_lease_lets_no_second_coordinator_in(
    broker: LocalBroker, peer: Peer, tmp_path: Path
) -> None:
    first = Coordinator(tmp_path, "first", broker)
    second: Coordinator | None = None
    try:
        first.wait_started()
        stop = threading.Event()

        # A released lease fifty times a second: past its first burst, the live one may
        # restore its lease twice a second (its lease budget), so the lease the second one
        # finds retained is nearly always the forged release, and the probe's answer
        # comes among forged releases.
        def forge() -> None:
            released = Lease(False, "forged-host", 1, 1.0).encode()
            while not stop.wait(0.02):
                peer.client.publish(LEASE, released, qos=1, retain=True)

        forger = threading.Thread(target=forge, daemon=True)
        forger.start()
        time.sleep(2.0)
        second = Coordinator(tmp_path, "second", broker)
        code = second.proc.wait(timeout=60)
        stop.set()
        forger.join(timeout=5)
        assert code == 2, second.output.read_text()[-2000:]
        last = second.output.read_text().strip().splitlines()[-1]
        assert last.startswith(f"mqttfl: error: run {RUN_ID!r} already has a live coordinator")
        assert f"pid {first.proc.pid}" in last
        time.sleep(2.0)
        assert first.proc.poll() is None  # the first one runs on ...
        assert first.events("lease.restored")  # ... keeps its lease ...
        # ... and never lost its session: the second was asked off before it connected
        # under the coordinator's client id, whichever lease the flood left retained
        assert len(first.events("broker.connected")) == 1
        assert not second.events("broker.connected")
        held = read_lease(peer.read_retained(LEASE) or b"")
        assert held.live
        assert held.pid == first.proc.pid
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.slow
def test_two_coordinators_that_take_each_other_over_end_with_the_first(
    broker: LocalBroker, peer: Peer, tmp_path: Path
) -> None:
    """Two started at the same instant both pass the look at the lease, and then take
    each other's MQTT session over (the same client id). The later one stops, also while
    a forger floods the lease topic with released leases."""
    first = Coordinator(tmp_path, "first", broker)
    stop = threading.Event()

    def forge() -> None:
        released = Lease(False, "forged-host", 1, 1.0).encode()
        while not stop.wait(0.1):
            peer.client.publish(LEASE, released, qos=1, retain=True)

    forger = threading.Thread(target=forge, daemon=True)
    try:
        first.wait_started()
        forger.start()
        config = load_config(CONFIG, [*TINY, f"broker.keepalive_s={KEEPALIVE_S}"])
        second = CoordinatorNode(config, BrokerAddress.parse(broker.url), tmp_path / "second")

        async def run_second() -> BaseException | None:
            try:
                await asyncio.wait_for(second.run(), timeout=60)
            except BaseException as exc:  # an ExceptionGroup of the TaskGroup
                return exc
            return None

        ended = asyncio.run(run_second())
        assert ended is not None
        error = first_mqttfl_error(ended)
        assert error is not None, ended
        assert "took this one's MQTT session over" in str(error)
        assert f"pid {first.proc.pid}" in str(error)
        time.sleep(2.0)  # the first one is back from the last time it was taken over
        connections = len(first.events("broker.connected"))
        time.sleep(3.0)
        assert first.proc.poll() is None
        assert len(first.events("broker.connected")) == connections  # no more flapping
        stop.set()
        forger.join(timeout=5)
        time.sleep(1.0)
        held = read_lease(peer.read_retained(LEASE) or b"")
        assert held.live
        assert held.pid == first.proc.pid
    finally:
        stop.set()
        first.stop()


def test_the_lease_guard_answers_restores_and_yields_to_an_older_rival() -> None:
    now = [100.0]
    own = Lease(True, "here", 20, 1000.0)
    guard = LeaseGuard(own, lambda: now[0])
    assert guard.judge(own.encode()) == "ignore"
    assert guard.judge(probe("abc")) == "answer"
    assert guard.judge(Lease(False, "here", 20, 1000.0).encode()) == "restore"  # a forgery
    assert guard.judge(b"") == "restore"  # the lease cleared
    older = Lease(True, "there", 7, 900.0).encode()
    younger = Lease(True, "there", 7, 1100.0).encode()
    assert guard.judge(older) == "restore"  # a claim alone stops nobody
    guard.lost_at = 99.0  # ... but with our session taken over, it is a real rival
    assert guard.judge(younger) == "restore"  # the later one stops, not us
    assert guard.judge(older) == "yield"
    assert "took this one's MQTT session over" in str(guard.yielded(RUN_ID, older))
    assert guard.judge(Lease(False, "here", 20, 1000.0).encode()) == "ignore"  # releasing


# --- row 15 -----------------------------------------------------------------------------
def test_only_a_change_of_a_site_counts_and_drops_are_spaced() -> None:
    notices = SiteNotices()
    told = [notices.change("kitchen", i % 2 == 1, i * 0.1) for i in range(100)]  # 10/s
    assert [t for t in told if t] == ["down", "up", "held"]
    assert notices.change("kitchen", False, SITE_HOLD_S + 1) == "down"


@pytest.mark.slow
def test_a_forged_site_notice_takes_a_client_out_once_and_it_comes_back(
    broker: LocalBroker, peer: Peer, tmp_path: Path
) -> None:
    rounds = 14
    fed = Federation(tmp_path, broker, clients=3, rounds=rounds)
    stop = threading.Event()

    def forge() -> None:  # kitchen down, up, down ... ten notices a second
        i = 0
        while not stop.wait(0.1):
            peer.client.publish(f"{BASE}/site/kitchen", b"01"[i % 2 : i % 2 + 1], qos=1)
            i += 1

    forger = threading.Thread(target=forge, daemon=True)
    with fed:
        fed.start_coordinator()
        fed.start_client("0", env={"MQTTFL_BROKER__SITE": "kitchen"})
        fed.start_client("1")
        fed.start_client("2")
        fed.wait_round_closed(2, timeout=120)
        forger.start()
        try:
            summary = fed.finish(timeout=240)
        finally:
            stop.set()
            forger.join(timeout=5)
    assert summary["rounds_completed"] == rounds
    assert fed.stalled_rounds() == []
    # The first forged drop counts and is logged; within SITE_HOLD_S no other one does.
    downs = fed.events(event="site.down")
    assert downs
    assert all(d["clients"] in (["0"], []) for d in downs)
    assert downs[0]["clients"] == ["0"]
    seconds = timestamp(fed.events(event="run.finished")[-1]) - timestamp(downs[0])
    assert len(downs) <= 1 + seconds / SITE_HOLD_S
    assert len(fed.events(event="site.held")) <= len(downs)
    # Client 0 is back as soon as it sends anything (its metrics of the round in
    # between): out of at most two rounds per drop, and in the last one.
    first = int(downs[0]["round"])
    opened = [t for t in range(first, rounds + 1) if fed.started(t)]
    without = [t for t in opened if "0" not in fed.started(t)[-1]["selected"]]
    assert len(without) <= 2 * len(downs), without
    assert "0" in fed.started(rounds)[-1]["selected"]


def test_broker_init_lets_only_the_coordinator_write_the_lease_and_a_bridge_its_site(
    tmp_path: Path,
) -> None:
    setup = init_broker(
        tmp_path / "setup",
        ["0", "1", "2"],
        run_id=RUN_ID,
        port=free_port(),
        bridges={"kitchen": ["0"], "lab": ["1", "2"]},
    )
    conf = setup.conf.read_text()
    assert "allow_anonymous false" in conf
    assert "max_keepalive 120" in conf
    peers: dict[str, Peer] = {}
    with LocalBroker(tmp_path / "run", port=setup.port, conf=conf):
        try:
            for name in ("coordinator", "watch", "2", "site-kitchen", "site-lab"):
                peers[name] = Peer(setup.port, setup.env(name))
            time.sleep(0.5)
            lease = Lease(True, "forged-host", 424242, time.time()).encode()
            site = f"{BASE}/site/kitchen"
            for name in ("2", "watch", "site-kitchen", "site-lab"):
                assert peers[name].publish(LEASE, lease, retain=True) == NOT_AUTHORIZED, name
            for name in ("2", "watch", "coordinator", "site-lab"):
                assert peers[name].publish(site, b"0") == NOT_AUTHORIZED, name
            assert peers["site-kitchen"].publish(site, b"1", retain=True) < ACCEPTED
            assert (
                peers["coordinator"].publish(LEASE, Lease(False).encode(), retain=True) < ACCEPTED
            )
            state = RunStatus("finished", 3, finished_at=time.time()).encode(RUN_ID)
            assert peers["coordinator"].publish(f"{BASE}/state", state, retain=True) < ACCEPTED
            # --clear-run under this ACL: the run's retained messages go, the bridge's notice
            # (its own to write) stays.
            env = setup.env("coordinator")
            config = load_config(CONFIG, [])
            credentials = Credentials(
                username=env["MQTTFL_BROKER__USERNAME"], password=env["MQTTFL_BROKER__PASSWORD"]
            )
            asyncio.run(
                claim_run(
                    config,
                    BrokerAddress.parse(setup.url),
                    credentials=credentials,
                    clear=True,
                )
            )
            assert peers["watch"].read_retained(f"{BASE}/state") is None
            assert peers["watch"].read_retained(site) == b"1"
        finally:
            for running in peers.values():
                running.close()


# --- item 6: `mqttfl run` never starts an open broker --------------------------------------
@pytest.mark.slow
def test_mqttfl_run_starts_a_locked_broker_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = [*TINY, "rounds=1", "federation.num_clients=2", "federation.min_clients=2"]
    result = mqttfl(
        "run",
        CONFIG,
        "--out",
        str(out),
        "--plain",
        "--no-local-reference",
        *[arg for item in sets for arg in ("--set", item)],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    conf = (out / "broker" / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf
    assert "allow_anonymous true" not in conf
    assert f"password_file {out / 'broker' / 'passwd'}" in conf
    assert f"acl_file {out / 'broker' / 'acl'}" in conf
    acl = (out / "broker" / "acl").read_text()
    assert f"user coordinator\ntopic readwrite {BASE}/state\ntopic readwrite {BASE}/lease\n" in acl
    assert "user 0\n" in acl
    device = acl.split("user 0\n")[1].split("\n\n")[0]
    assert f"topic read {BASE}/lease" in device  # whether its run has a live coordinator
    assert f"write {BASE}/lease" not in device  # the coordinator's identity alone writes it
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 1


def test_the_docs_say_what_an_open_broker_lets_any_peer_do() -> None:
    section = (REPO / "docs" / "explanation" / "security.md").read_text()
    for words in ("anonymous", "lease", "site", "max_inflight_messages", "EMQX", "rate"):
        assert words in section, words
    assert Topics(RUN_ID).lease == LEASE
