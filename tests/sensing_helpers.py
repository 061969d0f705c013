"""Shared pieces of the sensing tests: a finished tiny run exported, torch made
unimportable for `mqttfl sense`, and an MQTT recorder on the test broker."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.helpers import REPO, mqttfl

# `mqttfl sense` as a device without torch runs it: importing torch fails outright.
NO_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed on this device")
        return None
sys.meta_path.insert(0, _NoTorch())
from mqttfl.commands.main import main
code = main(sys.argv[1:])
assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
sys.exit(code)
"""


def sense_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", NO_TORCH, "sense", *args]


def sense(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`mqttfl sense ARGS` in a child process where torch cannot be imported."""
    return subprocess.run(
        sense_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def run_and_export(out: Path, config: str, overrides: list[str], client: str) -> tuple[Path, Path]:
    """A finished `mqttfl run` and its client exported with its shard: (run, export)."""
    run, exported = out / "run", out / "export"
    argv = ["run", config, "--out", str(run), "--no-local-reference"]
    for item in overrides:
        argv += ["--set", item]
    result = mqttfl(*argv, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    result = mqttfl(
        "export", str(run), "--client", client, "--out", str(exported), "--with-shard", timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run, exported


def last_metrics(run: Path, client: str) -> dict[str, Any]:
    records = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    mine = [r for r in records if str(r["client_id"]) == client]
    return max(mine, key=lambda r: int(r["round"]))


class Recorder:
    """Subscribes to everything on the broker and keeps (topic, payload, retain); with
    ``env`` (a credentials file's MQTTFL_BROKER__* variables) it logs in as that identity."""

    def __init__(self, port: int, env: dict[str, str] | None = None) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"rec-{time.time()}")
        if env is not None:
            self.client.username_pw_set(
                env["MQTTFL_BROKER__USERNAME"], env["MQTTFL_BROKER__PASSWORD"]
            )
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("#", qos=1)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self.lock:
            self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))

    def on(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p, _ in self.messages if t == topic]

    def wait_for(self, topic: str, payload: bytes | None = None, *, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.on(topic)
            if seen and (payload is None or payload in seen):
                return
            time.sleep(0.05)
        raise AssertionError(
            f"nothing {payload!r} on {topic} within {timeout}s: {self.messages[-5:]}"
        )

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(timeout=10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
