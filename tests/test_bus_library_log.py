"""aiomqtt's and paho's own records reach the structured log as one line, never stderr."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from mqttfl.bus.library_log import LIBRARY_LOG


def test_a_library_error_is_one_structured_line_and_no_traceback_on_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """aiomqtt logs a late SUBACK with its traceback; on stderr it would come ahead of a
    refusal's one line."""
    with capture_logs() as logs:
        pending: dict[int, object] = {}
        try:
            pending.pop(6)
        except KeyError:
            LIBRARY_LOG.exception('Unexpected message ID "%d" in on_subscribe callback', 6)
        LIBRARY_LOG.debug("paho's chatter stays out")
    assert "Traceback" not in capfd.readouterr().err
    assert [(e["event"], e["severity"]) for e in logs] == [("bus.library_logged", "error")]
    assert logs[0]["message"] == 'Unexpected message ID "6" in on_subscribe callback'
