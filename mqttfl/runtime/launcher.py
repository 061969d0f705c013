"""`mqttfl run`: a local broker, the coordinator and one OS process per client.

Everything started here is torn down on success, failure or Ctrl-C: children run in
their own sessions and are terminated (then killed) by us, and each child also exits by
itself if this process disappears (MQTTFL_PARENT_PID).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mqttfl.config import RunConfig
from mqttfl.errors import MqttflError
from mqttfl.logs import get_logger
from mqttfl.runtime.broker import LocalBroker

CHILD_GRACE_S = 30.0


def default_out_dir(config: RunConfig) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.run_id}-{stamp}"


class LocalFederation:
    def __init__(
        self,
        config: RunConfig,
        config_path: str | None,
        overrides: list[str],
        out_dir: Path,
        broker_url: str | None = None,
        *,
        coordinator_console: str = "info",
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        self.out_dir = out_dir
        self.broker_url = broker_url
        self.coordinator_console = coordinator_console
        self.broker: LocalBroker | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.log = get_logger(run_id=config.run_id, client_id="launcher")

    def _command(self, role: str, *extra: str) -> list[str]:
        cmd = [sys.executable, "-m", "mqttfl", role, "--broker", str(self.broker_url)]
        if self.config_path:
            cmd += ["--config", self.config_path]
        for item in self.overrides:
            cmd += ["--set", item]
        return cmd + list(extra)

    def _spawn(self, name: str, cmd: list[str], console_level: str) -> None:
        env = {
            **os.environ,
            "MQTTFL_PARENT_PID": str(os.getpid()),
            "MQTTFL_CONSOLE_LEVEL": console_level,
            "MQTTFL_LOG_DIR": str(self.out_dir / "logs"),
        }
        self.children[name] = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )

    def start_client(self, client_id: str) -> None:
        self._spawn(
            f"client-{client_id}",
            self._command(
                "client", "--id", client_id, "--state-dir", str(self.out_dir / "clients")
            ),
            "warning",
        )

    def run(self) -> dict[str, Any]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.broker_url is None:
                self.broker = LocalBroker(self.out_dir / "broker").start()
                self.broker_url = self.broker.url
                self.log.info("broker.started", url=self.broker_url)
            self._spawn(
                "coordinator",
                self._command("coordinator", "--out", str(self.out_dir)),
                self.coordinator_console,
            )
            for index in range(self.config.federation.num_clients):
                self.start_client(str(index))
            code = self._wait_coordinator()
            if code != 0:
                raise MqttflError(
                    f"the coordinator failed (exit {code}); see {self.out_dir / 'logs'}"
                )
            self._wait_clients(CHILD_GRACE_S)
            summary: dict[str, Any] = json.loads((self.out_dir / "summary.json").read_text())
            return summary
        finally:
            self.shutdown()

    def _wait_coordinator(self) -> int:
        coordinator = self.children["coordinator"]
        while True:
            code = coordinator.poll()
            if code is not None:
                return code
            time.sleep(0.2)

    def _wait_clients(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for name, child in self.children.items():
            if name.startswith("client-"):
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.log.warning("client.lingering", client=name)

    def shutdown(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.wait()
        if self.broker is not None:
            self.broker.stop()


def _signal_group(child: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def format_table(summary: dict[str, Any]) -> str:
    """The per-client result table printed at the end of a run."""
    lines = [
        f"{summary['method']} on run {summary['run_id']}: {summary['rounds_completed']} rounds "
        "(means over the last 5 rounds)",
        f"{'client':>8} {'accuracy':>9} {'macro-F1':>9} {'MAE':>7} {'KB sent':>10} {'KB recv':>10}",
    ]
    for client, row in summary["clients"].items():
        lines.append(
            f"{client:>8} {row['accuracy']:>9.4f} {row['f1']:>9.4f} {row['mae']:>7.3f} "
            f"{row['kb_sent']:>10.1f} {row['kb_received']:>10.1f}"
        )
    mean = summary["mean"]
    comm = summary["comm"]
    lines.append(f"{'mean':>8} {mean['accuracy']:>9.4f} {mean['f1']:>9.4f} {mean['mae']:>7.3f}")
    lines.append(
        f"payload per client-round: up {comm['up_bytes_per_client_round'] / 1000:.2f} KB, "
        f"down {comm['down_bytes_per_client_round'] / 1000:.2f} KB"
    )
    if summary.get("rejections"):
        lines.append(f"rejected uploads: {summary['rejections']}")
    return "\n".join(lines)
