"""The error tree of mqttfl.

    MqttflError                 base of every error mqttfl raises on purpose
    ├── UsageError              a command-line option or argument that is wrong, or a
    │                           combination the command cannot take (names the option)
    ├── ConfigError             a bad config key or value (names the dotted key)
    ├── DataError               a missing, unreadable or malformed data file (names the path)
    ├── FileError               another file or directory that is missing, unusable or not
    │                           what it should be (a run directory, a credentials file)
    ├── StateError              what is already there forbids it: a live coordinator, a
    │                           finished run, another run's checkpoint or client state
    ├── ModelError              a model or method cannot do what is asked of it
    ├── WireError               a message that cannot be decoded or is not permitted
    │   └── RejectedUpload      an upload the coordinator refuses (carries the reason)
    ├── FrameError              a sensor frame that cannot be read (also a ValueError)
    ├── RunAborted              the run cannot go on (too few clients after every retry,
    │                           a process of the run failed)
    └── BrokerError             the broker could not be started or reached
        └── Refused             the broker refused our login, a subscription or a publish
                                (:mod:`mqttfl.bus.refusal`)

Every raise under ``mqttfl/`` names one of the subclasses (``tests/test_errors_tree.py``
checks it, and that every exception class defined under ``mqttfl/`` descends from
:class:`MqttflError`). User errors are caught at the CLI edge as :class:`MqttflError` and
printed as one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator


class MqttflError(Exception):
    """Base class of all deliberate mqttfl errors."""


class UsageError(MqttflError):
    """A command-line option or argument is wrong, or goes with one it cannot; the
    message names the option."""


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


class FileError(MqttflError):
    """A file or directory (not a data file) is missing, unusable or not what it should
    be: a run directory, a credentials file, an output directory; the message names it."""


class StateError(MqttflError):
    """What is already there forbids the request: a live coordinator of the run, a
    finished run, a checkpoint or client state of another run or config."""


class ModelError(MqttflError):
    """A model or method cannot do what is asked (a weight vector of another shape, an
    export the architecture has nothing for)."""


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


class FrameError(MqttflError, ValueError):
    """A sensor frame that cannot be read; ``reason`` is the counter key. Also a
    ValueError, as it was when it lived in :mod:`mqttfl.sensing.frames`."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(detail)


class RunAborted(MqttflError):
    """The run cannot go on (too few clients after every retry, no aggregate possible,
    a process of the run failed)."""


class BrokerError(MqttflError):
    """The MQTT broker could not be started or reached."""


def first_mqttfl_error(
    error: BaseException, *, prefer: type[MqttflError] = MqttflError
) -> MqttflError | None:
    """The deliberate error inside ``error`` (asyncio.TaskGroup wraps what its tasks
    raise in exception groups, nested), so the edge can print it as one line: the first
    leaf of type ``prefer`` (depth first), else the first :class:`MqttflError`, else
    None. ``prefer`` names the root cause where a group holds its consequences too: a
    refusal by the broker (:class:`mqttfl.bus.refusal.Refused`) stops the bus, and a
    publish waiting on that bus then fails as well."""
    leaves = list(_leaves(error))
    for wanted in (prefer, MqttflError):
        for leaf in leaves:
            if isinstance(leaf, wanted):
                return leaf
    return None


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error
