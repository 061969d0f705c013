"""A RabbitMQ node (Debian's rabbitmq-server, MQTT plugin) as a child process on loopback.

Each node gets its own name, ports, data and log directories under the test's tmp dir;
nodes started with the same ``home`` share an Erlang cookie and can form a cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mqttfl.provisioning.local_broker import free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the wrapper in /usr/sbin drops to user rabbitmq
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


def available() -> bool:
    return Path(SERVER).exists() and Path(CTL).exists()


@dataclass
class RabbitNode:
    home: Path  # shared by the nodes of one cluster (the Erlang cookie lives there)
    name: str
    mqtt_port: int = field(default_factory=free_port)
    amqp_port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.mqtt_port}"

    @property
    def base(self) -> Path:
        return self.home / self.name

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HOME": str(self.home),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_PID_FILE": str(self.base / "pid"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.base / "feature_flags"),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",  # Erlang's port mapper stays on loopback too
        }

    def start(self, *, timeout: float = 120.0) -> RabbitNode:
        for sub in ("mnesia", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"mqtt.listeners.tcp.default = 127.0.0.1:{self.mqtt_port}\n"
            "mqtt.allow_anonymous = true\n"
            "loopback_users = none\n"
        )
        (self.base / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        with open(self.base / "out.log", "wb") as out:
            self.process = subprocess.Popen(
                [SERVER],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.node} exited: {(self.base / 'out.log').read_text()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.mqtt_port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.node} did not listen for MQTT within {timeout:.0f}s")

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        result = subprocess.run(
            [CTL, "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    def join(self, other: RabbitNode) -> None:
        """Make this node a member of ``other``'s cluster."""
        self.ctl("stop_app")
        self.ctl("join_cluster", other.node)
        self.ctl("start_app")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
