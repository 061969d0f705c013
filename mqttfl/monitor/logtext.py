"""How `mqttfl logs` writes an event: a JSON line (for a pipe), or a readable line (for a
terminal): time, process, level, event, then its other fields as ``key=value``.

A log holds what peers sent (a reason, a client id), so a readable line shows no
character that a terminal would act on: a value with one is written JSON-escaped.
"""

from __future__ import annotations

import json
import zlib
from datetime import UTC
from typing import Any

from mqttfl.monitor.logview import Event

#: fields every line shows in its own columns
COLUMNS = ("timestamp", "level", "event")
EVENT_WIDTH = 18  # most event names fit: their fields then start in one column
RESET, BOLD, DIM = "\x1b[0m", "\x1b[1m", "\x1b[2m"
LEVEL_STYLES = {
    "debug": DIM,
    "info": "\x1b[32m",
    "warning": "\x1b[33m",
    "error": "\x1b[1;31m",
    "critical": "\x1b[1;31m",
}
PROCESS_STYLES = ("\x1b[36m", "\x1b[35m", "\x1b[34m", "\x1b[33m", "\x1b[32m", "\x1b[96m")


def json_line(event: Event) -> str:
    """The event as its process wrote it, with the process first (the merge loses
    which file a line came from)."""
    fields = {k: v for k, v in event.fields.items() if k != "process"}
    return json.dumps({"process": event.process, **fields})


class TextLines:
    """Readable lines, one per event. The UTC date comes on a line of its own when it
    changes; the run id, when it stays the same, the run instance, but where it changes,
    and a client id the process's name already says are left out."""

    def __init__(self, *, colour: bool, width: int = 12) -> None:
        self.colour = colour
        self.width = width  # of the process column; grows to the longest name seen
        self._day: str | None = None
        self._run_id: object = None
        self._starts: dict[str, object] = {}  # process -> its start id seen last
        self._instance: object = None  # the run instance seen last, by any process

    def __call__(self, event: Event) -> str:
        at = event.at.astimezone(UTC)
        day = at.date().isoformat()
        header = ""
        if day != self._day:
            self._day = day
            header = self._style(DIM, f"-- {day} (UTC) --") + "\n"
        clock = f"{at.hour:02d}:{at.minute:02d}:{at.second:02d}.{at.microsecond // 1000:03d}"
        self.width = max(self.width, len(event.process))
        fields = [
            self._style(DIM, f"{key}=") + _value(value)
            for key, value in event.fields.items()
            if key not in COLUMNS and not self._known(event, key, value)
        ]
        level = event.level
        return header + " ".join(
            [
                clock,
                self._style(_process_style(event.process), _safe(event.process).ljust(self.width)),
                self._style(LEVEL_STYLES.get(level, ""), _safe(level).ljust(7)),
                self._style(BOLD, _safe(event.name).ljust(EVENT_WIDTH if fields else 0)),
                *fields,
            ]
        )

    def _known(self, event: Event, key: str, value: Any) -> bool:
        """Whether the line would only repeat what its columns or earlier lines say."""
        if key == "client_id":
            return isinstance(value, str) and (
                event.process in (value, f"client-{value}")
                or event.process.startswith(f"{value}-")  # clients-0-2 is "clients"
            )
        if key == "run_id":
            if self._run_id is None:
                self._run_id = value
            return bool(value == self._run_id)
        if key == "instance":  # shown where the merged view enters another instance
            seen, self._instance = self._instance, value
            return bool(seen == value)
        if key in ("process", "pid"):  # the process column says it
            return True
        if key == "start":  # shown when a process starts anew in the same file
            seen = self._starts.get(event.process)
            self._starts[event.process] = value
            return seen is None or seen == value
        return False

    def _style(self, style: str, text: str) -> str:
        return f"{style}{text}{RESET}" if self.colour and style else text


def _process_style(process: str) -> str:
    return PROCESS_STYLES[zlib.crc32(process.encode()) % len(PROCESS_STYLES)]


def _safe(text: str) -> str:
    return text if text.isprintable() else json.dumps(text)


def _value(value: Any) -> str:
    """A string as it is when it reads as one word; anything else as JSON."""
    if type(value) in (int, float):  # most fields; not bool, which JSON spells true
        return repr(value)
    if isinstance(value, str):
        plain = bool(value) and value.isprintable() and not any(c in value for c in ' ="')
        return value if plain else json.dumps(value)
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError):
        return json.dumps(str(value))
