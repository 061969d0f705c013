"""Fault-injection harness: a federation of real OS processes on a real Mosquitto.

The coordinator and every client are `python -m mqttfl ...` processes (started with
:func:`helpers.spawn`, each in its own session), so a fault is what it would be on a
device: SIGKILL, SIGSTOP/SIGCONT, a restart with the same state dir or run dir.
Assertions read the JSON-lines logs (one per process, appended across restarts) and,
through a :class:`Witness`, what actually crossed the broker.

From a test::

    with Federation(tmp_path, broker, clients=8, rounds=10) as fed:
        fed.start()
        fed.wait_for(lambda: 2 in fed.closed_rounds(), timeout=60, what="round 2")
        fed.kill("3")
        fed.restart("3")
        summary = fed.finish(timeout=120)

From benchmarks/: ``sys.path.insert(0, "<repo>/tests")`` then ``from faults import ...``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from mqttfl.provisioning.local_broker import LocalBroker
from tests.helpers import FAST, REPO, spawn

CONFIG = "configs/fedapa-csi.toml"
RUN_ID = "fedapa-csi"
# Tiny model, tiny shards, short deadlines: a round takes about a second.
TINY = [
    *FAST,
    "model.name=tiny",
    "data.samples_per_client=60",
    "federation.round_timeout_s=10",
    "federation.join_timeout_s=60",
]
# A round may close this much after its deadline (aggregate, publish, checkpoint).
CLOSE_SLACK_S = 3.0


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of one log; a line still being written is skipped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def timestamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def wait_for(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


@dataclass
class Seen:
    at: float
    topic: str
    payload: bytes
    retain: bool


class Witness:
    """A plain MQTT subscriber that records what crossed the broker.

    ``on_message(seen)`` runs in paho's network thread the instant a message arrives
    (e.g. to SIGKILL a client the moment its upload reaches the broker).
    """

    def __init__(
        self,
        broker_port: int,
        topics: Iterable[str],
        *,
        username: str | None = None,
        password: str | None = None,
        ca: str | None = None,
        on_message: Callable[[Seen], None] | None = None,
        name: str = "witness",
    ) -> None:
        self.messages: list[Seen] = []
        self.on_message = on_message
        self.topics = list(topics)
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{name}-{os.getpid()}-{id(self)}"
        )
        if username:
            self.client.username_pw_set(username, password)
        if ca:
            self.client.tls_set_context(ssl.create_default_context(cafile=ca))
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *args: self.subscribed.set()
        self.client.on_message = self._on_message
        # paho annotates the delays as int, but they are seconds used as floats
        self.client.reconnect_delay_set(0.1, 1.0)  # type: ignore[arg-type]
        self.client.connect_async("127.0.0.1", broker_port, keepalive=10)

    def _on_connect(
        self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        if not reason.is_failure:
            client.subscribe([(topic, 1) for topic in self.topics])

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        seen = Seen(time.time(), message.topic, bytes(message.payload), bool(message.retain))
        with self._lock:
            self.messages.append(seen)
        if self.on_message is not None:
            self.on_message(seen)

    def start(self, *, timeout: float = 10.0) -> Witness:
        self.client.loop_start()
        if not self.subscribed.wait(timeout):
            raise AssertionError("the witness could not subscribe")
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def seen(self, predicate: Callable[[Seen], bool] | None = None) -> list[Seen]:
        with self._lock:
            return [m for m in self.messages if predicate is None or predicate(m)]

    def __enter__(self) -> Witness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def topic_parts(topic: str) -> list[str]:
    """``mqttfl/<run>/round/<t>/up/<client>`` -> ['round', t, 'up', client]."""
    return topic.split("/")[2:]


@dataclass
class Federation:
    """Coordinator and clients as real processes; every fault is a signal or a restart."""

    root: Path
    broker: LocalBroker
    clients: int = 3
    rounds: int = 5
    overrides: list[str] = field(default_factory=list)
    config: str = CONFIG
    env: dict[str, str] = field(default_factory=dict)
    broker_url: str | None = None
    client_overrides: dict[str, list[str]] = field(default_factory=dict)
    client_brokers: dict[str, str] = field(default_factory=dict)  # a client's own broker URL
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: Counter[str] = field(default_factory=Counter)
    killed: list[tuple[float, str]] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)

    @property
    def out(self) -> Path:
        return self.root / "run"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def round_timeout_s(self) -> float:
        value = next(
            (
                o.split("=", 1)[1]
                for o in reversed(self.all_overrides)
                if o.startswith("federation.round_timeout_s=")
            ),
            "60",
        )
        return float(value)

    @property
    def all_overrides(self) -> list[str]:
        return [
            *TINY,
            f"rounds={self.rounds}",
            f"federation.num_clients={self.clients}",
            *self.overrides,
        ]

    def _common(self, extra: list[str] | None = None) -> list[str]:
        args = ["--config", self.config, "--broker", self.broker_url or self.broker.url]
        for item in [*self.all_overrides, *(extra or [])]:
            args += ["--set", item]
        return args

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self.starts[name] += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        proc = spawn(
            *args,
            log=self.root / f"{name}.{self.starts[name]}.out",
            env={"MQTTFL_LOG_DIR": str(self.logs), **self.env, **(env or {})},
        )
        self.procs[name] = proc
        return proc

    # --- processes --------------------------------------------------------------------
    def start(self) -> Federation:
        self.start_coordinator()
        for index in range(self.clients):
            self.start_client(str(index))
        return self

    def start_coordinator(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self._spawn(
            "coordinator", ["coordinator", *self._common(), "--out", str(self.out)], env
        )

    def start_client(self, cid: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        args = [
            "client",
            *self._common(self.client_overrides.get(cid)),
            "--id",
            cid,
            "--state-dir",
            str(self.state_dir),
        ]
        if cid in self.client_brokers:  # the last --broker wins
            args += ["--broker", self.client_brokers[cid]]
        return self._spawn(cid, args, env)

    def start_load(
        self, count: int, *, name: str = "load", extra: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """The torch-free load client (mqttfl.testing.loadclient): ``count`` simulated
        devices (``extra``: more of its options, e.g. ``["--upload", "weights"]``)."""
        self.starts[name] += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "mqttfl.testing.loadclient",
            "--clients",
            str(count),
            "--log",
            str(self.logs / f"{name}.jsonl"),
            *self._common(),
            *(extra or []),
        ]
        with open(self.root / f"{name}.{self.starts[name]}.out", "wb") as handle:
            proc = subprocess.Popen(
                cmd,
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def kill(self, name: str) -> None:
        """SIGKILL, as a power cut would: no last words, the broker fires the last will."""
        proc = self.procs[name]
        signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)
        self.killed.append((time.time(), name))
        self.stopped.discard(name)

    def stop(self, name: str) -> None:
        signal_group(self.procs[name], signal.SIGSTOP)
        self.stopped.add(name)

    def cont(self, name: str) -> None:
        signal_group(self.procs[name], signal.SIGCONT)
        self.stopped.discard(name)

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        if self.alive(name):
            self.kill(name)
        return self.start_coordinator() if name == "coordinator" else self.start_client(name)

    def finish(self, *, timeout: float, clients_timeout: float = 60.0) -> dict[str, Any]:
        """Wait for the coordinator to exit 0 and every live client to exit 0; return summary.json."""
        code = self.procs["coordinator"].wait(timeout=timeout)
        assert code == 0, f"coordinator exit {code}:\n{self.output('coordinator')[-3000:]}"
        for name, proc in self.procs.items():
            if name != "coordinator" and proc.poll() is None:
                assert proc.wait(timeout=clients_timeout) == 0, self.output(name)[-3000:]
            elif name != "coordinator" and proc.returncode not in (0, -signal.SIGKILL):
                raise AssertionError(
                    f"client {name} exit {proc.returncode}:\n{self.output(name)[-3000:]}"
                )
        summary: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return summary

    def output(self, name: str) -> str:
        return (self.root / f"{name}.{self.starts[name]}.out").read_text(errors="replace")

    def close(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                if name in self.stopped:
                    signal_group(proc, signal.SIGCONT)
                signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- logs -------------------------------------------------------------------------
    def events(self, name: str = "coordinator", event: str | None = None) -> list[dict[str, Any]]:
        file = "coordinator.jsonl" if name == "coordinator" else f"client-{name}.jsonl"
        found = read_events(self.logs / file)
        return found if event is None else [e for e in found if e["event"] == event]

    def closed_rounds(self) -> dict[int, list[dict[str, Any]]]:
        closed: dict[int, list[dict[str, Any]]] = {}
        for e in self.events(event="round.closed"):
            closed.setdefault(int(e["round"]), []).append(e)
        return closed

    def last_closed(self) -> int:
        return max(self.closed_rounds(), default=0)

    def started(self, t: int) -> list[dict[str, Any]]:
        return [e for e in self.events(event="round.started") if e["round"] == t]

    def wait_for(self, predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
        def checked() -> Any:
            coordinator = self.procs.get("coordinator")
            if coordinator is not None and coordinator.poll() not in (None, 0, -signal.SIGKILL):
                raise AssertionError(
                    f"coordinator died ({coordinator.returncode}) while waiting for {what}:\n"
                    + self.output("coordinator")[-3000:]
                )
            return predicate()

        return wait_for(checked, timeout=timeout, what=what)

    def wait_round_closed(self, t: int, *, timeout: float = 60.0) -> None:
        self.wait_for(
            lambda: t in self.closed_rounds(), timeout=timeout, what=f"round {t} to close"
        )

    def wait_training(self, cid: str, t: int, *, timeout: float = 60.0) -> dict[str, Any]:
        """Until client ``cid`` logs that it began local training for round t."""
        event: dict[str, Any] = self.wait_for(
            lambda: next(
                (e for e in self.events(cid, "training.started") if e["round"] == t), None
            ),
            timeout=timeout,
            what=f"client {cid} to start training round {t}",
        )
        return event

    def wait_round_started(self, t: int, *, timeout: float = 60.0) -> dict[str, Any]:
        event: dict[str, Any] = self.wait_for(
            lambda: next(reversed(self.started(t)), None),
            timeout=timeout,
            what=f"round {t} to start",
        )
        return event

    # --- accounting ---------------------------------------------------------------------
    def outcomes(self) -> dict[tuple[int, str], list[str]]:
        """Per (round, client): what the coordinator logged about that client's upload(s)."""
        found: dict[tuple[int, str], list[str]] = {}
        for e in self.events():
            key = None
            if e["event"] == "upload.accepted":
                key, what = (int(e["round"]), str(e["client"])), "accepted"
            elif e["event"] in ("upload.late", "upload.rejected"):
                key, what = (int(e["round"]), str(e["client"])), f"{e['event']}:{e['reason']}"
            elif e["event"] == "upload.missing":
                key, what = (int(e["round"]), str(e["client"])), "missing"
            if key is not None:
                found.setdefault(key, []).append(what)
        return found

    def stalled_rounds(self) -> list[int]:
        """Rounds that closed later than their last attempt's deadline (plus CLOSE_SLACK_S)."""
        stalled = []
        for t, closes in self.closed_rounds().items():
            starts = [timestamp(e) for e in self.started(t)]
            if (
                not starts
                or timestamp(closes[-1]) > max(starts) + self.round_timeout_s + CLOSE_SLACK_S
            ):
                stalled.append(t)
        return sorted(stalled)

    def figures(self) -> dict[str, Any]:
        """The drill's headline numbers, for a benchmark report."""
        closed = self.closed_rounds()
        outcomes = [o for found in self.outcomes().values() for o in found]
        return {
            "rounds_closed": len(closed),
            "rounds_closed_twice": sum(1 for v in closed.values() if len(v) > 1),
            "stalled_rounds": len(self.stalled_rounds()),
            "kills": len(self.killed),
            "clients_killed": len({name for _, name in self.killed}),
            "restarts": sum(n - 1 for n in self.starts.values()),
            "uploads_accepted": outcomes.count("accepted"),
            "uploads_missing": outcomes.count("missing"),
            "uploads_late_or_rejected": sum(1 for o in outcomes if o.startswith("upload.")),
        }

    def uploads_sent(self, cid: str) -> list[int]:
        return [int(e["round"]) for e in self.events(cid, "upload.sent")]


def uploads_on_the_wire(witness: Witness) -> Counter[tuple[int, str]]:
    """(round, client) of every upload the broker relayed (payload non-empty)."""
    found: Counter[tuple[int, str]] = Counter()
    for seen in witness.seen():
        parts = topic_parts(seen.topic)
        if len(parts) == 4 and parts[0] == "round" and parts[2] == "up":
            found[(int(parts[1]), parts[3])] += 1
    return found
