"""The logs of a run's processes, merged in time order (`mqttfl logs`).

Every process writes its own JSON-lines file (:mod:`mqttfl.logs`): the coordinator, each
client device, the launcher. Following one round means reading them side by side, so
this reads them together: each file in the order it was written, merged on the
``timestamp`` field, filtered, once or as the files grow (:func:`follow`). A line that
is not a whole event (a JSON object with an ISO timestamp: a crash cut it, or another
program wrote it) is skipped and counted, never trusted; the last line of a file that is
followed is held until its newline comes. Nothing here runs unless `mqttfl logs` does:
the processes only write their files.
"""

from __future__ import annotations

import collections
import heapq
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TextIO

from mqttfl.errors import FileError
from mqttfl.paths import LOCK_FILE

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
POLL_S = 0.25  # how often a followed directory is looked at again
CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Event:
    """One log line: when, which process wrote it (its file's name), what it holds."""

    at: datetime
    process: str
    fields: dict[str, object]

    @property
    def name(self) -> str:
        return str(self.fields.get("event", ""))

    @property
    def level(self) -> str:
        return str(self.fields.get("level", "info"))


@dataclass(frozen=True)
class EventFilter:
    """Which events to show; an unset criterion lets every event through."""

    round: int | None = None
    client: str | None = None  # its client_id, its client field, or client-<id>'s file
    events: tuple[str, ...] = ()  # fnmatch patterns of the event name, any of them
    level: str = "debug"  # the lowest level shown
    instance: str | None = None  # the start of the run instance's id

    def __call__(self, event: Event) -> bool:
        fields = event.fields
        if self.round is not None:
            value = fields.get("round")
            if isinstance(value, bool) or value != self.round:
                return False
        if self.client is not None and not self._about(event, self.client):
            return False
        if self.instance is not None:
            instance = _text(fields.get("instance"))
            if instance is None or not instance.startswith(self.instance):
                return False
        if self.events and not any(fnmatchcase(event.name, p) for p in self.events):
            return False
        return LEVELS.get(event.level, LEVELS["info"]) >= LEVELS[self.level]

    @staticmethod
    def _about(event: Event, client: str) -> bool:
        fields = event.fields
        return (
            client in (_text(fields.get("client_id")), _text(fields.get("client")))
            or event.process == f"client-{client}"
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None if value is None else str(value)


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class LogFile:
    """One process's log, read from where the last read stopped."""

    def __init__(self, path: Path, process: str) -> None:
        self.path = path
        self.process = process
        self.skipped = 0  # lines that were not whole events
        self._offset = 0
        self._pending = b""  # the start of a line whose newline has not come yet
        self._identity: tuple[int, int] | None = None

    def read(self, *, final: bool) -> Iterator[Event]:
        """The events written since the last read, in the file's order. A last line
        without its newline waits for the next read, unless ``final``: then it counts
        if it is a whole event (it lacks only its newline) and is skipped if not."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, also on an early stop
        except OSError:
            return  # gone since it was listed (a run directory set aside)
        with handle:
            stat = os.fstat(handle.fileno())
            identity = (stat.st_dev, stat.st_ino)
            if identity != self._identity or stat.st_size < self._offset:
                # another file by that name now, or cut back: read it from its start
                self._identity, self._offset, self._pending = identity, 0, b""
            handle.seek(self._offset)
            while chunk := handle.read(CHUNK_BYTES):
                self._offset += len(chunk)
                *lines, self._pending = (self._pending + chunk).split(b"\n")
                for line in lines:
                    event = self._parse(line)
                    if event is not None:
                        yield event
        if final and self._pending:
            line, self._pending = self._pending, b""
            event = self._parse(line)
            if event is not None:
                yield event

    def _parse(self, line: bytes) -> Event | None:
        if not line.strip():
            return None
        try:
            fields = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            fields = None
        at = _time(fields.get("timestamp")) if isinstance(fields, dict) else None
        if fields is None or at is None:
            self.skipped += 1
            return None
        return Event(at, self.process, fields)


class LogSources:
    """The logs named on the command line: files, and directories of ``*.jsonl`` files
    (a run directory's ``logs/``), looked at again for files that appear later."""

    def __init__(self, paths: Sequence[Path]) -> None:
        for path in paths:
            if not path.exists():
                raise FileError(f"{path}: no such file or directory")
        self.paths = list(paths)
        self.files: list[LogFile] = []
        self._known: set[Path] = set()
        self.refresh()

    def refresh(self) -> None:
        """Add the files that appeared in the directories since the last look."""
        for path in self.paths:
            if not path.is_dir():
                self._add(path)
                continue
            # a run directory's logs are in logs/, also before it exists (its metrics.jsonl
            # is no log)
            run = (path / "logs").is_dir() or (path / LOCK_FILE).exists()
            folder = path / "logs" if run else path
            for found in sorted(folder.glob("*.jsonl")):
                self._add(found)

    def _add(self, path: Path) -> None:
        resolved = path.resolve()
        if resolved in self._known:
            return
        self._known.add(resolved)
        process = path.stem
        if any(f.process == process for f in self.files):  # two runs' coordinator.jsonl
            owner = path.parent.parent if path.parent.name == "logs" else path.parent
            process = f"{owner.name}/{process}"
        self.files.append(LogFile(path, process))

    def check_some(self) -> None:
        if not self.files:
            named = ", ".join(str(p) for p in self.paths)
            raise FileError(f"{named}: no log files here (*.jsonl, or a logs/ folder of them)")

    def skipped(self) -> dict[str, int]:
        """Lines skipped so far, per file name (files with none left out)."""
        return {f.path.name: f.skipped for f in self.files if f.skipped}


def merged(sources: LogSources, keep: EventFilter, *, final: bool = True) -> Iterator[Event]:
    """The events the files hold now, of all of them in time order."""
    streams = [(e for e in f.read(final=final) if keep(e)) for f in sources.files]
    return heapq.merge(*streams, key=lambda e: e.at)


def follow(
    sources: LogSources,
    keep: EventFilter,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Event]:
    """The events written from now on, without end: what each file (and each file that
    appeared) has grown by at every look, in time order within the look."""
    while True:
        sleep(poll_s)
        sources.refresh()
        batch = [e for f in sources.files for e in f.read(final=False) if keep(e)]
        yield from sorted(batch, key=lambda e: e.at)


def show(
    sources: LogSources,
    keep: EventFilter,
    render: Callable[[Event], str],
    out: TextIO,
    *,
    last: int | None = None,
    following: bool = False,
) -> None:
    """Write what the logs hold (its ``last`` events only, if given), then, when
    ``following``, what they are given from now on, until interrupted."""
    now: Iterable[Event] = merged(sources, keep, final=not following)
    if last is not None:
        now = collections.deque(now, maxlen=last)
    for event in now:
        out.write(render(event) + "\n")
    out.flush()
    if following:
        for event in follow(sources, keep):
            out.write(render(event) + "\n")
            out.flush()
