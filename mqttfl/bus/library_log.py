"""Where aiomqtt's and paho's own log records go: the process's structured log."""

from __future__ import annotations

import contextlib
import logging

from mqttfl.logs import get_logger


class _IntoStructuredLog(logging.Handler):
    """aiomqtt's and paho's own records (an acknowledgement that came after its waiter had
    gone, a callback that raised) as one line of the process's structured log, never a
    traceback on stderr, where a refusal must stay one line."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a log line must never be what ends a client
            get_logger(component="bus").warning(
                "bus.library_logged",
                severity=record.levelname.lower(),
                message=record.getMessage()[:300],
            )


LIBRARY_LOG = logging.getLogger("mqttfl.bus.library")
LIBRARY_LOG.setLevel(logging.WARNING)
LIBRARY_LOG.addHandler(_IntoStructuredLog())
LIBRARY_LOG.propagate = False
