"""structlog setup: JSON lines to one file per process, readable lines on a TTY.

Event names are dotted verbs (``round.closed``, ``upload.rejected``); ``run_id``,
``round`` and ``client_id`` are bound as context by the runtime. Every line of the file
also says which process wrote it: ``process`` (the file's name, e.g. ``client-3``),
``pid`` and ``start``, an id of this start of the process, so that two runs appended to
one file (a device restarted, a run id used again) can be told apart; and, once the
process knows it, the run's ``instance`` (:func:`tag_process`), so that the instances of
one run id (started again with ``--clear-run``) can be told apart in a merged view.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO, cast

import structlog

from mqttfl.errors import FileError

#: fields every line of this process carries from now on (:func:`tag_process`)
_PROCESS_TAGS: dict[str, object] = {}

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Tee:
    """Write each rendered event to the JSON file and, pretty, to the console."""

    def __init__(
        self, file: TextIO | None, console: TextIO | None, console_level: int, process: str
    ):
        self._file = file
        self._process, self._pid, self._start = process, 0, ""
        self._console = console
        self._console_level = console_level
        self._pretty = structlog.dev.ConsoleRenderer(colors=bool(console and console.isatty()))
        self._json = structlog.processors.JSONRenderer()

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        if self._console is not None and _LEVELS.get(method, logging.INFO) >= self._console_level:
            self._console.write(self._pretty(logger, method, dict(event)) + "\n")
            self._console.flush()
        if self._pid != os.getpid():  # (a forked child that kept its parent's set-up)
            self._pid, self._start = os.getpid(), secrets.token_hex(4)
        stamp = {"process": self._process, "pid": self._pid, "start": self._start}
        # a line's own pid (or instance) wins over the stamp
        rendered = self._json(logger, method, {**stamp, **_PROCESS_TAGS, **event})
        # JSONRenderer gives bytes only with a bytes-returning serializer, which we don't use.
        line = rendered.decode() if isinstance(rendered, bytes) else rendered
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
        return line


class _NullLogger:
    def msg(self, *args: Any, **kwargs: Any) -> None:
        return None

    debug = info = warning = warn = error = critical = exception = log = msg


def configure_logging(
    log_file: Path | None,
    *,
    level: str = "info",
    console: TextIO | None = sys.stderr,
    console_level: str | None = None,
) -> None:
    """Route structlog events to ``log_file`` (JSON lines) and ``console`` (pretty);
    ``console_level="off"`` keeps the console free (`mqttfl run` draws its view there)."""
    if console_level == "off":
        console, console_level = None, None
    file = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file = os.fdopen(_open_log(log_file), "a", buffering=1, encoding="utf-8")
    threshold = _LEVELS[level]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _Tee(file, console, _LEVELS[console_level or level], log_file.stem if log_file else ""),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=lambda *args: _NullLogger(),
        cache_logger_on_first_use=False,
    )


def _open_log(path: Path) -> int:
    """The log file, opened to append; a symbolic link there (planted to have the records
    appended to its target) is one :class:`FileError` naming it."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise FileError(
                f"{path} is a symbolic link (to {os.readlink(path)}): mqttfl writes no file "
                "through a link; remove it"
            ) from None
        raise


def tag_process(**fields: object) -> None:
    """Every later line of this process carries ``fields`` (a line's own value wins),
    whichever task or logger writes it: the run ``instance`` once the process knows it."""
    _PROCESS_TAGS.update(fields)


def get_logger(**context: Any) -> structlog.typing.FilteringBoundLogger:
    return cast("structlog.typing.FilteringBoundLogger", structlog.get_logger().bind(**context))
