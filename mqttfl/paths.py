"""Output directories named on the command line: checked before anything is written
(or, for a run that starts afresh in one, before it is set aside).

A path the user cannot write to (a regular file in the way, a read-only parent) is a
user error, reported as one line that names the path, never as an ``OSError`` traceback.

A run directory (`mqttfl run`'s or `mqttfl coordinator`'s ``--out``) is also locked and
kept free of symbolic links (:func:`claim_run_dir`). Two runs in one would mix their
journals and logs and replace each other's broker credentials: the first takes an
exclusive ``flock`` on :data:`LOCK_FILE` inside it, with its pid written there, and holds
it until it exits; a second stops in one line naming that pid. The coordinator that
`mqttfl run` starts shares its launcher's lock: it inherits the locked open file, which
is the same lock, so it is not refused and the lock outlives neither. A link planted in
a run directory would have the run write its files (password hashes, log records) over
the link's target: ``--out`` as a link, or a link found in it when the run claims it, is
refused in one line naming it, and run files are opened with ``O_NOFOLLOW`` besides
(:func:`open_nofollow`), for a link planted while the run goes on.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from mqttfl.errors import FileError, StateError


def cache_root() -> Path:
    """Where mqttfl keeps what it can make again: ``$MQTTFL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/mqttfl``, else ``~/.cache/mqttfl``."""
    explicit = os.environ.get("MQTTFL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mqttfl"


def creation_problem(path: Path) -> str | None:
    """Why ``path`` cannot be created (or written into) as a directory, or None."""
    ancestor = Path(os.path.abspath(path))
    try:
        while not ancestor.exists() and ancestor.parent != ancestor:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{ancestor} is not a directory"
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None


def make_dir(path: Path, *, what: str) -> Path:
    """Create the directory ``path`` (and its parents) to write into; return it.

    Raises :class:`MqttflError` naming ``what`` (``--out``) and the path if it cannot be
    created or written into.
    """
    problem = creation_problem(path)
    if problem is None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if problem is not None:
        raise FileError(f"{what} {path}: cannot create the directory: {problem}")
    return path


def check_set_aside(path: Path, *, what: str) -> None:
    """Raise :class:`FileError` naming ``what`` unless the directory ``path`` could be
    renamed beside itself (:func:`mqttfl.files.set_aside_dir`): its parent is writable,
    and it is not (nor does it hold) the working directory, which would move with it."""
    here = Path(os.path.abspath(path))
    cwd = Path.cwd()
    if here == cwd or here in cwd.parents:
        raise FileError(
            f"{what} {path}: the directory you are in (or one holding it) cannot be set "
            "aside; name the run directory from outside it"
        )
    if not here.exists():
        return
    if not here.is_dir():
        raise FileError(f"{what} {path}: not a directory")
    if not os.access(here.parent, os.W_OK | os.X_OK):
        raise FileError(f"{what} {path}: cannot set it aside: {here.parent} is not writable")


# --- a run directory: free of links, locked for one run at a time --------------------------
#: the lock file inside a run directory; it holds the pid of the process that took it
LOCK_FILE = "run.lock"
#: set for a child that shares its parent's lock: the number of the inherited descriptor
LOCK_FD_VARIABLE = "MQTTFL_RUN_LOCK_FD"


def link_refused(path: Path) -> FileError:
    """The one line for a symbolic link where a run writes a file or directory."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return FileError(
        f"{path} is a symbolic link{target}: mqttfl writes no file through a link; remove it"
    )


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` itself: a link planted there would
    have us write over its target. :class:`FileError` naming it instead."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise link_refused(path) from None
        raise


def first_link(directory: Path) -> Path | None:
    """The first symbolic link below ``directory`` (not entering linked directories)."""
    for root, dirs, files in os.walk(directory):
        for name in sorted([*dirs, *files]):
            if os.path.islink(os.path.join(root, name)):
                return Path(root) / name
    return None


@dataclass(frozen=True)
class RunLock:
    """An exclusive ``flock`` on a run directory's :data:`LOCK_FILE`, held while ``fd`` is
    open: in this process or in a child it is passed to (:meth:`child_env`)."""

    path: Path
    fd: int

    def child_env(self) -> dict[str, str]:
        """The environment of a child that shares this lock (give it ``pass_fds=(fd,)``)."""
        return {LOCK_FD_VARIABLE: str(self.fd)}


def claim_run_dir(path: Path, *, what: str = "--out") -> RunLock:
    """Create the run directory ``path`` and lock it for the rest of this process's life;
    one line naming ``what`` if ``path`` is a symbolic link, holds one, or is locked by
    another process (its pid)."""
    if path.is_symlink():
        raise FileError(
            f"{what} {path} is a symbolic link (to {os.readlink(path)}): name the directory itself"
        )
    make_dir(path, what=what)
    lock = lock_run_dir(path, what=what)
    link = first_link(path)
    if link is not None:
        raise link_refused(link)
    return lock


def lock_run_dir(directory: Path, *, what: str) -> RunLock:
    """The lock of ``directory``: the one its parent passed down (:data:`LOCK_FD_VARIABLE`),
    else a new one, with this process's pid written in the lock file."""
    path = directory / LOCK_FILE
    inherited = _inherited_lock(path)
    if inherited is not None:
        return RunLock(path, inherited)
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise FileError(f"{what} {directory}: cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise FileError(f"{what} {directory}: cannot lock {path}: {exc.strerror}") from None
        raise StateError(
            f"{what} {directory} is in use by {holder}, which holds {path}: wait for it to "
            f"end, or choose another {what}"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunLock(path, fd)


def _inherited_lock(path: Path) -> int | None:
    """The descriptor of ``path`` a parent passed down holding its lock, or None."""
    text = os.environ.pop(LOCK_FD_VARIABLE, "")  # ours alone: not for our own children
    if not text.isdigit():
        return None
    fd = int(text)
    try:
        held, here = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if (held.st_dev, held.st_ino) != (here.st_dev, here.st_ino):
        return None
    try:  # the same open file holds the lock already: this only confirms it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    os.set_inheritable(fd, False)
    return fd


def _holder(fd: int) -> str:
    """``process 1234``: who holds the lock, as its lock file says."""
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"process {text}" if text.isdigit() else "another process"
