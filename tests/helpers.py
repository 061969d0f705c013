"""Helpers for tests that drive the real command line and real OS processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Tiny, fast federations for end-to-end tests: small windows and shards.
FAST = [
    "data.window=24",
    "data.samples_per_client=120",
    "federation.round_timeout_s=60",
    "federation.join_timeout_s=60",
    "federation.final_metrics_timeout_s=20",
    "model.name=middle",
]


def mqttfl(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "mqttfl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
    )


def spawn(
    *args: str, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `mqttfl ...` as a separate OS process (one per device)."""
    with open(log, "wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "mqttfl", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=cwd or REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes naming ``text`` (the broker's names its run dir)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found
