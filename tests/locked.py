"""A Mosquitto locked by `mqttfl broker init` (a password and an ACL per identity), and
the commands a person types against it, as real processes with their own output files."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mqttfl.provisioning.broker_init import read_env_file
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from tests.helpers import REPO


@dataclass
class Started:
    """One command a person started in a folder of its own, and what it wrote."""

    name: str
    proc: subprocess.Popen[bytes]
    folder: Path
    began: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    @property
    def stdout(self) -> str:
        return (self.folder / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.folder / "stderr").read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=max(0.1, timeout - (time.monotonic() - self.began)))
        except subprocess.TimeoutExpired:
            # SIGABRT first: faulthandler (PYTHONFAULTHANDLER, set in env()) writes every
            # thread's stack to stderr, so that a hang says where it hung
            os.killpg(self.proc.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(
                f"{self.name} still ran after {timeout:.0f} s: {self.stderr[-3000:]}\n"
                f"{self.log_tails()}"
            ) from None
        self.seconds = self.seconds or round(time.monotonic() - self.began, 1)
        return code

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of each log the command wrote in its folder."""
        tails = []
        for log in sorted(self.folder.glob("logs/*.jsonl")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name} ---\n" + "\n".join(text))
        return "\n".join(tails)

    def ended(self) -> bool:
        """Whether it has exited (noting how long it ran, the first time)."""
        if self.proc.poll() is None:
            return False
        self.seconds = self.seconds or round(time.monotonic() - self.began, 1)
        return True

    def one_error_line(self) -> str:
        """Its stderr, which must be one line, ``mqttfl: error: ...``, with no traceback
        (nor exception group) anywhere in what it wrote."""
        for text in (self.stdout, self.stderr):
            assert "Traceback" not in text, f"{self.name}: {self.stderr[-3000:]}"
            assert "ExceptionGroup" not in text, f"{self.name}: {self.stderr[-3000:]}"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, f"{self.name}: {len(lines)} lines: {self.stderr[-3000:]}"
        assert lines[0].startswith("mqttfl: error: "), f"{self.name}: {lines[0]}"
        return lines[0]


def wait_all(started: list[Started], timeout: float) -> None:
    """Until every one has exited (each one's time noted as it does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [one for one in started if not one.ended()]  # every one looked at
        if not running:
            break
        time.sleep(0.1)
    for one in started:
        one.wait(timeout)


@dataclass
class Locked:
    """A broker from `broker init` for ``run_id``, and what it wrote for each identity."""

    setup: Path
    work: Path
    url: str
    run_id: str

    @property
    def credentials(self) -> Path:
        return self.setup / "credentials"

    def env(self, identity: str | None, **extra: str) -> dict[str, str]:
        """A fresh shell on a device: no broker credentials unless ``identity``'s file was
        sourced (``set -a; . credentials/<id>.env; set +a``). Its console shows errors
        only: the progress lines a device prints as it starts are not what is checked."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MQTTFL_BROKER__")}
        if identity is not None:
            env.update(read_env_file(self.credentials / f"{identity}.env"))
        return {
            **env,
            "PYTHONPATH": str(REPO),
            "MQTTFL_CONSOLE_LEVEL": "error",
            "PYTHONFAULTHANDLER": "1",
            **extra,
        }

    def start(self, name: str, *args: str, identity: str | None, **extra: str) -> Started:
        """``mqttfl ARGS`` in a folder of its own (its logs and client state go there)."""
        folder = self.work / name
        folder.mkdir(parents=True)
        with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mqttfl", *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=folder,
                env=self.env(identity, **extra),
                start_new_session=True,
            )
        return Started(name, proc, folder)


@contextmanager
def locked_broker(run_id: str, *, clients: int = 2) -> Iterator[Locked]:
    """`mqttfl broker init --clients N --run-id RUN` and its Mosquitto, on loopback."""
    # Outside pytest's private (0700) temp folders, so that a broker started as root can
    # drop to its own user and still read its files, as in a deployment.
    work = Path(tempfile.mkdtemp(prefix="mqttfl-locked-", dir="/tmp"))
    work.chmod(0o755)
    setup = work / "broker-setup"
    init = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttfl",
            "broker",
            "init",
            "--clients",
            str(clients),
            "--run-id",
            run_id,
            "--port",
            str(free_port()),
            "--out",
            str(setup),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert init.returncode == 0, init.stderr
    conf = (setup / "mosquitto.conf").read_text()
    port = int(re.findall(r"^listener (\d+)", conf, re.M)[0])
    try:
        with LocalBroker(work / "mosquitto", port=port, conf=conf) as broker:
            yield Locked(setup, work, broker.url, run_id)
    finally:
        shutil.rmtree(work, ignore_errors=True)
