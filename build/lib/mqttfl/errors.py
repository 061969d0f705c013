"""The error tree of mqttfl.

    MqttflError                 base of every error mqttfl raises on purpose
    ├── ConfigError             a bad config key or value (names the dotted key)
    ├── DataError               a missing, unreadable or malformed data file (names the path)
    ├── WireError               a message that cannot be decoded or is not permitted
    │   └── RejectedUpload      an upload the coordinator refuses (carries the reason)
    ├── RunAborted              the run cannot go on (too few clients after every retry)
    └── BrokerError             the broker could not be started or reached

User errors are caught at the CLI edge and printed as one line, never a traceback.
"""

from __future__ import annotations


class MqttflError(Exception):
    """Base class of all deliberate mqttfl errors."""


class ConfigError(MqttflError):
    """A config key is unknown or its value is invalid; ``key`` is the dotted path."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key '{key}': {message}")


class DataError(MqttflError):
    """A data file is missing or malformed; ``path`` names it."""

    def __init__(self, path: object, message: str) -> None:
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class WireError(MqttflError):
    """A message could not be decoded or does not match its schema.

    ``reason`` is a short machine-readable code (``malformed``, ``dtype``, ``shape`` ...)
    used as the counter key in the coordinator's rejection tally.
    """

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class RejectedUpload(WireError):
    """An upload refused by the coordinator (stale round, wrong sender, duplicate...)."""

    round: int | None = None
    client: str | None = None


class RunAborted(MqttflError):
    """The run cannot go on (too few clients after every retry, no aggregate possible)."""


class BrokerError(MqttflError):
    """The MQTT broker could not be started or reached."""


def first_mqttfl_error(error: BaseException) -> MqttflError | None:
    """The first deliberate error inside an exception group (asyncio.TaskGroup wraps what
    its tasks raise), so the edge can print it as one line."""
    if isinstance(error, MqttflError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = first_mqttfl_error(inner)
            if found is not None:
                return found
    return None
