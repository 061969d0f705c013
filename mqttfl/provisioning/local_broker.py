"""Start and stop a local Mosquitto on a free loopback port (for `mqttfl run` and tests)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from mqttfl.errors import BrokerError
from mqttfl.files import write_atomic
from mqttfl.paths import first_link, link_refused, open_nofollow
from mqttfl.processes import end_with_parent

# The same sizing as broker/mosquitto.conf, for a throwaway broker on 127.0.0.1.
# {run_as}: started as root, mosquitto would switch to the "mosquitto" user, which cannot
# write its log or persistence file in the caller's (private) work directory; it would
# then lose every queued message when it restarts.
LOCAL_CONF = """\
listener {port} 127.0.0.1
{run_as}allow_anonymous true
max_packet_size 67108864
max_queued_messages 100000
max_queued_bytes 0
max_inflight_messages 100
queue_qos0_messages true
persistence {persistence}
persistence_location {state_dir}/
set_tcp_nodelay true
sys_interval 1
log_dest file {log_path}
log_type error
log_type warning
log_type notice
log_type subscribe
connection_messages true
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )
    if found is None:
        raise BrokerError("mosquitto is not installed: run `sudo apt-get install mosquitto`")
    return found


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` (0.2 s timeout)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class LocalBroker:
    """A mosquitto child process; ``conf`` may replace the default local config.
    ``end_with_parent``: it stops when this process dies, even by ``kill -9``
    (:mod:`mqttfl.processes`; start it from a thread that lives as long as it should)."""

    work_dir: Path
    port: int = field(default_factory=free_port)
    persistence: bool = False
    conf: str | None = None
    process: subprocess.Popen[bytes] | None = None
    end_with_parent: bool = False

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "mosquitto.log"

    @property
    def conf_path(self) -> Path:
        return self.work_dir / "mosquitto.conf"

    def start(self, *, timeout: float = 10.0) -> LocalBroker:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # Mosquitto writes its log and store through any link planted here.
        link = first_link(self.work_dir)
        if link is not None:
            raise link_refused(link)
        text = self.conf or LOCAL_CONF
        conf = text.format(
            port=self.port,
            persistence="true" if self.persistence else "false",
            state_dir=self.work_dir,
            log_path=self.log_path,
            run_as="user root\n" if os.geteuid() == 0 else "",  # no effect for other users
        )
        write_atomic(self.conf_path, conf.encode(), sync=False)
        os.close(open_nofollow(self.log_path, os.O_WRONLY | os.O_CREAT))
        stderr_path = self.work_dir / "mosquitto.stderr"
        cmd = [mosquitto_binary(), "-c", str(self.conf_path)]
        with os.fdopen(
            open_nofollow(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb"
        ) as stderr:
            self.process = subprocess.Popen(
                end_with_parent(cmd) if self.end_with_parent else cmd,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = stderr_path.read_text(errors="replace")
                raise BrokerError(
                    f"mosquitto exited at start ({self.process.returncode}): {err.strip()}"
                )
            if port_open(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"mosquitto did not listen on port {self.port} within {timeout:.0f}s")

    def stop(self, *, timeout: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (for broker-restart drills)."""
        self.stop()
        self.start()

    def __enter__(self) -> LocalBroker:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
