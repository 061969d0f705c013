"""A finished tiny run to break files of, and the checks of what a command did with them.

The run is a real ``mqttfl run`` (its own Mosquitto, a coordinator and two client
processes, three rounds of the tiny model): its directory holds what a user's does,
``summary.json``, ``metrics.jsonl``, ``checkpoint.msgpack`` and the one before it, and
each client's state file.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mqttfl.paths import LOCK_FILE
from tests.faults import RUN_ID, TINY
from tests.helpers import mqttfl

ROUNDS, CLIENTS = 3, 2
OVERRIDES = [*TINY, f"rounds={ROUNDS}", f"federation.num_clients={CLIENTS}"]


def settings(*extra: str) -> list[str]:
    """``--set`` arguments for the run's config (plus ``extra`` overrides)."""
    args = []
    for item in [*OVERRIDES, *extra]:
        args += ["--set", item]
    return args


def finish_a_run(out: Path) -> Path:
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--out",
        str(out),
        "--no-local-reference",
        "--plain",
        *settings(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def copy_run(run: Path, to: Path) -> Path:
    """The run's files (not its broker or logs) in a directory of their own."""
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("broker", "logs", "report"))
    return to


def state_file(run: Path, client: str) -> Path:
    return run / "clients" / RUN_ID / f"client-{client}.pt"


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory``, by relative path: its bytes. Not the lock files: a
    command that claims a run directory writes its pid there, and then may refuse."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``mqttfl: error:`` line of a command that failed as a user error."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("mqttfl: error: "), result.stderr[-3000:]
    return lines[0]
