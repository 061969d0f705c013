"""Files that survive the crash that interrupts them, and readers that never trust them.

- :func:`write_atomic` writes a whole file as one step: a temporary file in the same
  directory, flushed and fsynced, renamed over the old one, the directory fsynced. A
  reader sees the old file or the new one, never half of one.
- No writer here follows a symbolic link where its file goes: the link is refused in one
  :class:`~mqttfl.errors.FileError` naming it, and its target is left as it was.
- JSON-lines journals are appended one whole line per write (:func:`append_line`).
  :func:`read_json_lines` reads them up to their last complete line: what a writer killed
  mid-line left after it is the ``tail``, not an error, and never changes the file.
  :func:`set_aside_tail` (for the writer that resumes the journal) copies such a tail to
  ``<file>.partial-<time>`` and cuts the file back to its last complete line, so the next
  append starts a line of its own; nothing is destroyed.
- :func:`set_aside` renames a file that cannot be used to ``<file>.<label>-<time>``.
  :func:`set_aside_dir` renames a run directory that starts afresh to
  ``<dir>.previous-<time>`` and makes it again, empty.

Every reader turns what it cannot read into one :class:`~mqttfl.errors.DataError` naming
the file and what is wrong, never a traceback.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqttfl.errors import DataError, FileError
from mqttfl.logs import get_logger
from mqttfl.paths import link_refused, make_dir, open_nofollow

__all__ = [
    "JsonLines",
    "append_line",
    "one_line",
    "read_bytes",
    "read_json",
    "read_json_lines",
    "set_aside",
    "set_aside_tail",
    "sync_file",
    "write_atomic",
]


def one_line(text: object, limit: int = 240) -> str:
    """``text`` (an exception's message, say) as one line of at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def write_atomic(
    path: Path, data: bytes | memoryview, *, sync: bool = True, mode: int = 0o666
) -> None:
    """Replace ``path`` in one step. Unsynced, the new file survives our process dying
    (it is in the page cache) but not the machine losing power until :func:`sync_file`.
    ``mode`` is the new file's, less the umask. A symbolic link at ``path`` is refused
    (:class:`FileError`); the rename would replace the link, never write its target."""
    if os.path.islink(path):
        raise link_refused(path)
    # A name of its own (two writers never share one), created as open() would (the umask
    # decides its mode, unlike mkstemp's 0600).
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync:
        _sync_dir(path.parent)


def keep_copy(path: Path, copy: Path) -> None:
    """Make ``copy`` hold ``path``'s bytes, replacing it in one step, while ``path`` stays
    where it is: a reader never finds neither. A hard link where the file system has them,
    else a copy. A symbolic link at either name is refused (:class:`FileError`)."""
    for name in (path, copy):
        if os.path.islink(name):
            raise link_refused(name)
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        try:
            os.link(path, tmp, follow_symlinks=False)
        except OSError:  # no hard links here (FAT, some network mounts)
            write_atomic(tmp, read_bytes(path), sync=False)
        os.replace(tmp, copy)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: Path) -> None:
    """fsync a file and its directory entry (after an unsynced :func:`write_atomic`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_dir(path.parent)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` and its newline in one ``write`` (O_APPEND): a process killed here
    leaves at most one partial line, at the end. A symbolic link at ``path`` is refused."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def stamp() -> str:
    """A name part for files set aside: the local time, to the microsecond."""
    now = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{int(now % 1 * 1e6):06d}"


def set_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<name>.<label>-<time>`` beside it; return the new path."""
    aside = path.with_name(f"{path.name}.{label}-{stamp()}")
    os.replace(path, aside)
    return aside


def set_aside_dir(path: Path, *, what: str) -> Path | None:
    """Rename the directory ``path`` to ``<name>.previous-<time>`` beside it and create
    ``path`` again, empty: nothing in it is deleted. Returns where its files went (None if
    it held nothing, when it is left as it is)."""
    if not path.is_dir() or not any(path.iterdir()):
        return None
    try:
        kept = set_aside(Path(os.path.abspath(path)), "previous")
    except OSError as exc:
        raise FileError(f"{what} {path}: cannot set it aside: {exc.strerror or exc}") from None
    make_dir(path, what=what)
    return kept


def read_bytes(path: Path) -> bytes:
    """The file's bytes; :class:`DataError` naming it if it is missing or unreadable."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(path, "file not found") from None
    except OSError as exc:
        raise DataError(path, f"unreadable: {exc.strerror or exc}") from None


def _loads(text: bytes) -> Any:
    """json.loads, with what it raises on hostile input narrowed to ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json(path: Path) -> Any:
    """A whole JSON file; :class:`DataError` naming it if it is missing or not JSON."""
    raw = read_bytes(path)
    try:
        return _loads(raw)
    except ValueError as exc:
        raise DataError(path, f"is not valid JSON: {one_line(exc)}") from None


@dataclass(frozen=True)
class JsonLines:
    """A JSON-lines file as read: its complete lines and what follows the last one."""

    path: Path
    lines: list[tuple[int, Any]]  # (line number, value) of each complete, non-blank line
    size: int  # bytes read
    complete: int  # bytes up to and with the last complete line
    tail: bytes  # a line cut short by a writer that died (b"" if none)
    whole_tail: bool  # the tail is a whole JSON object that lacks only its newline

    @property
    def values(self) -> list[Any]:
        return [value for _, value in self.lines]


def read_json_lines(path: Path) -> JsonLines:
    """The complete lines of a JSON-lines file (none if it does not exist), never
    changing it. A line after the last newline is the ``tail``: kept as a line when it is
    a whole JSON object, else left out. :class:`DataError` naming the file and line if a
    complete line is not JSON."""
    try:
        raw = read_bytes(path)
    except DataError:
        if not Path(path).exists():
            return JsonLines(Path(path), [], 0, 0, b"", False)
        raise
    complete = raw.rfind(b"\n") + 1
    lines = []
    for number, line in enumerate(raw[:complete].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            lines.append((number, _loads(line)))
        except ValueError as exc:
            raise DataError(path, f"line {number} is not JSON: {one_line(exc)}") from None
    tail = raw[complete:]
    whole = False
    if tail.strip():
        try:
            value = _loads(tail)
        except ValueError:
            value = None
        if isinstance(value, dict):
            whole = True
            lines.append((raw.count(b"\n") + 1, value))
    return JsonLines(Path(path), lines, len(raw), complete, tail, whole)


def set_aside_tail(read: JsonLines) -> Path | None:
    """Make the journal end at its last complete line before anything is appended: a whole
    object that lacks only its newline gets it; anything else after the last newline is
    copied to ``<file>.partial-<time>`` and cut from the file (one
    ``journal.tail_set_aside`` log line). Returns the copy's path, or None."""
    if not read.tail:
        return None
    path = read.path
    if os.path.getsize(path) != read.size:
        raise DataError(path, "changed while it was being read: is another process writing it?")
    if read.whole_tail:
        append_line(path, "")
        return None
    aside = path.with_name(f"{path.name}.partial-{stamp()}")
    write_atomic(aside, read.tail)
    fd = open_nofollow(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, read.complete)
        os.fsync(fd)
    finally:
        os.close(fd)
    get_logger().warning(
        "journal.tail_set_aside",
        path=str(path),
        kept_as=aside.name,
        bytes=len(read.tail),
        reason="a partial last line (a writer killed mid-line)",
    )
    return aside
