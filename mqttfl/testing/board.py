"""A device's budget on this machine: a cgroup (v1) with a memory limit, pinned to CPUs.

What a Raspberry Pi Zero 2 W or a 512 MB gateway gives a client: :class:`Board` makes a
``memory`` cgroup with ``memory.limit_in_bytes`` and a ``cpuset`` cgroup of one CPU (as
root), and :meth:`Board.command` wraps a command line so that the process joins both
before it runs. The kernel's OOM killer then acts as the board's would, and
``memory.oom_control`` counts its kills. The board test (``tests/test_board.py``) and
the device benchmark (``benchmarks/bench_device.py``) use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from types import TracebackType

CGROUP_ROOT = Path("/sys/fs/cgroup")


def unavailable() -> str | None:
    """Why a board cannot be made here (no cgroup v1 memory or cpuset controller, not
    root), or None."""
    for controller in ("memory", "cpuset"):
        if not (CGROUP_ROOT / controller / "cgroup.procs").is_file():
            return f"no cgroup v1 {controller} controller at {CGROUP_ROOT / controller}"
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    return None


class Board:
    """``with Board(512 * 2**20, cpus="0") as board: Popen(board.command(cmd))``."""

    def __init__(self, memory_bytes: int, *, cpus: str = "0", name: str | None = None) -> None:
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.name = name or f"mqttfl-board-{secrets.token_hex(4)}"
        self.memory = CGROUP_ROOT / "memory" / self.name
        self.cpuset = CGROUP_ROOT / "cpuset" / self.name

    def __enter__(self) -> Board:
        problem = unavailable()
        if problem is not None:
            raise OSError(problem)
        self.memory.mkdir()
        self.cpuset.mkdir()
        (self.memory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        with contextlib.suppress(OSError):  # no swap here; where there is, none for the board
            (self.memory / "memory.memsw.limit_in_bytes").write_text(str(self.memory_bytes))
        (self.cpuset / "cpuset.cpus").write_text(self.cpus)
        mems = (CGROUP_ROOT / "cpuset" / "cpuset.mems").read_text().strip()
        (self.cpuset / "cpuset.mems").write_text(mems)
        return self

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the board: a shell joins both cgroups, then execs it."""
        join = (
            f'echo $$ > "{self.memory}/cgroup.procs" && '
            f'echo $$ > "{self.cpuset}/cgroup.procs" && exec "$@"'
        )
        return ["/bin/sh", "-c", join, "board", *argv]

    def oom_kills(self) -> int:
        """Processes the OOM killer ended inside the board."""
        for line in (self.memory / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        """The board's peak charge (anonymous memory and the page cache it brought in)."""
        return int((self.memory / "memory.max_usage_in_bytes").read_text())

    def failures(self) -> int:
        """Times an allocation hit the limit (memory was reclaimed, or a kill followed)."""
        return int((self.memory / "memory.failcnt").read_text())

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for group in (self.memory, self.cpuset):
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    for pid in (group / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), 9)
                    time.sleep(0.1)
