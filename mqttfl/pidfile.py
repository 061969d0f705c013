"""A client device's process, found by its run and id.

Every client process (`mqttfl client`, or a child forked by `mqttfl clients`) names
itself ``c<id>@<run id>``, cut to the 15 bytes Linux keeps (what ps, top and
``pgrep -x`` show), and writes its pid to ``<state dir>/<run id>/client-<id>.pid``. It
holds that file locked (``flock``) while it lives and removes it at a clean exit, so a
file left by a process killed outright is not locked: ``pkill -9 -L -F FILE`` (``-L``:
only a locked pid file) kills the device's process, and never a process that reused
the pid of a dead one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from mqttfl.errors import FileError
from mqttfl.files import write_atomic
from mqttfl.logs import get_logger
from mqttfl.paths import make_dir, open_nofollow
from mqttfl.processes import NAME_BYTES, set_process_name


def client_process_name(run_id: str, client_id: str) -> str:
    """``c3@fedapa-csi``: the id first, so that a long run id loses its end, not the id."""
    return f"c{client_id}@{run_id}".encode()[:NAME_BYTES].decode(errors="ignore")


def pid_file(state_dir: Path, run_id: str, client_id: str) -> Path:
    """Where client ``client_id`` of ``run_id`` keeps its pid (beside its state)."""
    return state_dir / run_id / f"client-{client_id}.pid"


@contextlib.contextmanager
def findable_client(state_dir: Path, run_id: str, client_id: str) -> Iterator[Path]:
    """This process named for client ``client_id`` of ``run_id``, with its pid file
    written and locked while the block runs; the file is removed when the block ends."""
    name = client_process_name(run_id, client_id)
    set_process_name(name)
    path = pid_file(state_dir, run_id, client_id)
    make_dir(path.parent, what="--state-dir")
    pid = os.getpid()
    try:
        # A pid means nothing after a power cut: no fsync.
        write_atomic(path, f"{pid}\n".encode(), sync=False, mode=0o644)
        lock = open_nofollow(path, os.O_RDONLY)
    except OSError as exc:
        raise FileError(
            f"--state-dir {state_dir}: cannot write {path}: {exc.strerror or exc}"
        ) from None
    try:
        # A file of its own (the rename made a new one): nobody else holds its lock.
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        get_logger(run_id=run_id, client_id=client_id).info(
            "process.named", name=name, pid=pid, pid_file=str(path)
        )
        yield path
    finally:
        _remove_own(path, pid)
        os.close(lock)


def _remove_own(path: Path, pid: int) -> None:
    """Remove ``path`` if it still names ``pid``: a second process of the same client
    (started while this one lived) wrote its own, which stays."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(pid):
            path.unlink()
