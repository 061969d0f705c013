"""Typed control messages: status, round start, run status, acknowledgement, metrics, downlink.

Every message from the broker is hostile until it has been through one of the ``read_*``
functions here. Each builds a frozen dataclass that validates itself in
``__post_init__``, so a value that crossed the wire is checked once, at decode, and is
trusted after. Every failure is a :class:`~mqttfl.errors.WireError` with a reason code;
nothing else escapes (a test fuzzes that).

Time never travels as a wall-clock instant: a round start carries ``timeout_s``, the
seconds left when it was sent, so a device whose clock is minutes off (no RTC, no NTP)
computes the same deadline from its own monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mqttfl.errors import WireError
from mqttfl.wire.codec import Message, decode, encode
from mqttfl.wire.ids import check_id
from mqttfl.wire.schemas import ClientInfo
from mqttfl.wire.topics import MAX_ROUND

COORDINATOR = "coordinator"
CONTROL_LIMIT = 1_000_000  # control messages are small; anything bigger is hostile
MAX_SAMPLE_DIMS, MAX_SAMPLE_SIDE = 4, 65_536  # bounds of an announced sample shape
MAX_CLIENTS = 100_000  # ids in one selection
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_UNIX_TIME = 1e11  # year 5138
MAX_PARAMS = 64  # round parameters and extra metrics: small maps of named numbers
MAX_KEY_CHARS = 64
MAX_REASON_CHARS = 200
RunPhase = Literal["waiting", "open", "closed", "finished"]
INSTANCE_CHARS = frozenset("0123456789abcdef")
MAX_INSTANCE_CHARS = 32
_PHASES = ("waiting", "open", "closed", "finished")

Number = int | float | bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def finite_number(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError("type", f"'{name}' must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise WireError("non_finite", f"'{name}' is NaN or Inf")
    if not low <= value <= high:
        raise WireError("range", f"'{name}'={value!r} outside [{low}, {high}]")


def round_number(value: Any, *, low: int = 0) -> int:
    if not _is_int(value) or not low <= value <= MAX_ROUND:
        raise WireError("round", f"round must be an integer in [{low}, {MAX_ROUND}], got {value!r}")
    return int(value)


def client_ids(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or len(value) > MAX_CLIENTS:
        raise WireError("type", f"'{name}' must be a list of at most {MAX_CLIENTS} client ids")
    for item in value:
        if not isinstance(item, str):
            raise WireError("type", f"'{name}' holds a {type(item).__name__}, not a client id")
        check_id(item)
    if len(set(value)) != len(value):
        raise WireError("range", f"'{name}' repeats a client id")
    return tuple(value)


def _named_numbers(name: str, value: Any, *, bound: float = math.inf) -> dict[str, Number]:
    """A small map of short names to finite numbers (round parameters, extra metrics)."""
    if not isinstance(value, Mapping) or len(value) > MAX_PARAMS:
        raise WireError("type", f"'{name}' must be a map of at most {MAX_PARAMS} entries")
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            raise WireError("type", f"'{name}' has a key that is not a short string")
        if not isinstance(item, bool):
            finite_number(f"{name}.{key}", item, low=-bound, high=bound)
    return dict(value)


def run_instance(value: Any) -> str:
    """A run instance id (lowercase hex, empty where the sender named none)."""
    if not isinstance(value, str) or len(value) > MAX_INSTANCE_CHARS or set(value) - INSTANCE_CHARS:
        raise WireError("type", f"'instance' must be at most {MAX_INSTANCE_CHARS} hex digits")
    return value


def settings_digest(value: object) -> str:
    """A manifest's SHA-256 digest (64 lowercase hex digits; empty where none is said)."""
    if not isinstance(value, str) or (value and (len(value) != 64 or set(value) - INSTANCE_CHARS)):
        raise WireError("type", "'settings' must be a manifest's digest, 64 hex digits")
    return value


def text_field(name: str, value: Any, limit: int = MAX_REASON_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise WireError("type", f"'{name}' must be a string of at most {limit} characters")
    return value


def body_keys(
    body: Mapping[str, Any], required: set[str], optional: frozenset[str] = frozenset()
) -> None:
    missing = sorted(required - body.keys())
    if missing:
        raise WireError("missing_field", f"control message lacks {missing}")
    unknown = sorted(str(k) for k in body.keys() - required - optional)
    if unknown:
        raise WireError("unknown_field", f"control message has unknown fields {unknown}")


def read_envelope(
    raw: bytes,
    kind: str,
    run_id: str,
    *,
    sender: str | None,
    round: int | None,
    max_bytes: int | None = CONTROL_LIMIT,
) -> Message:
    """Decode (bounded), then check type, run, sender and round against the topic."""
    return check_envelope(decode(raw, max_bytes=max_bytes), kind, run_id, sender, round)


def check_envelope(
    message: Message, kind: str, run_id: str, sender: str | None, round: int | None
) -> Message:
    if message.type != kind:
        raise WireError("type", f"expected a {kind} message, got {message.type!r}")
    if message.run != run_id:
        raise WireError("run", f"message for run {message.run[:80]!r}, not {run_id!r}")
    if sender is not None and message.sender != sender:
        raise WireError("sender", f"{kind} from {message.sender[:80]!r} on {sender!r}'s topic")
    if round is not None and message.round != round:
        raise WireError("round_mismatch", f"message says round {message.round}, topic says {round}")
    return message


# --- status ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Online:
    """A client's retained announcement: its model, classes, sample count and shape."""

    info: ClientInfo

    def __post_init__(self) -> None:
        info = self.info
        check_id(info.client_id)
        text_field("arch", info.arch, MAX_KEY_CHARS)
        # The coordinator builds the announced model to size its uploads: a sample shape
        # of 10^9 features would make that a memory bomb.
        shape = info.sample_shape
        if not 1 <= len(shape) <= MAX_SAMPLE_DIMS or not all(
            _is_int(n) and 1 <= n <= MAX_SAMPLE_SIDE for n in shape
        ):
            raise WireError(
                "range", f"sample_shape needs 1-{MAX_SAMPLE_DIMS} sides of 1-{MAX_SAMPLE_SIDE}"
            )
        if not _is_int(info.num_samples) or not 0 <= info.num_samples <= 2**40:
            raise WireError("range", "num_samples out of range")
        if len(info.classes) > 2**16 or not all(
            _is_int(c) and 0 <= c < 2**16 for c in info.classes
        ):
            raise WireError("range", "classes must be at most 65536 integers in [0, 65536)")
        if info.site:
            check_id(info.site, "site")

    def encode(self, run: str) -> bytes:
        body = {
            "state": "online",
            "arch": self.info.arch,
            "classes": list(self.info.classes),
            "num_samples": self.info.num_samples,
            "sample_shape": list(self.info.sample_shape),
        }
        if self.info.site:
            body["site"] = self.info.site
        return encode(Message("status", run, 0, self.info.client_id, body))


@dataclass(frozen=True)
class Offline:
    client_id: str
    reason: str = ""

    def __post_init__(self) -> None:
        check_id(self.client_id)
        text_field("reason", self.reason)

    def encode(self, run: str) -> bytes:
        body = {"state": "offline", "reason": self.reason}
        return encode(Message("status", run, 0, self.client_id, body))


Status = Online | Offline


def read_status(raw: bytes, *, run_id: str, client: str) -> Status:
    message = read_envelope(raw, "status", run_id, sender=client, round=None)
    body = message.body
    state = body.get("state")
    if state == "offline":
        body_keys(body, {"state"}, frozenset({"reason"}))
        return Offline(client, text_field("reason", body.get("reason", "")))
    if state != "online":
        raise WireError("range", f"unknown status {str(state)[:20]!r}")
    body_keys(
        body, {"state", "arch", "classes", "num_samples", "sample_shape"}, frozenset({"site"})
    )
    for key in ("classes", "sample_shape"):
        if not isinstance(body[key], list):
            raise WireError("type", f"'{key}' must be a list")
    info = ClientInfo(
        client_id=client,
        arch=text_field("arch", body["arch"], MAX_KEY_CHARS),
        classes=tuple(body["classes"]),
        num_samples=body["num_samples"],
        sample_shape=tuple(body["sample_shape"]),
        site=text_field("site", body.get("site", ""), MAX_KEY_CHARS),
    )
    return Online(info)


# --- sites -----------------------------------------------------------------------------
SITE_UP, SITE_DOWN = b"1", b"0"  # what Mosquitto's bridge publishes on its notification topic


def read_site_notice(raw: bytes) -> bool:
    """A bridge's connection notice (its last will says ``0``): True when the site is up."""
    if raw not in (SITE_UP, SITE_DOWN):
        raise WireError("malformed", "a site notice is b'1' or b'0'")
    return raw == SITE_UP


# --- round start and run status ---------------------------------------------------------
@dataclass(frozen=True)
class RoundStart:
    """Round ``round`` is open for ``selected`` for ``timeout_s`` more seconds.

    ``uploaded`` lists the clients whose upload the coordinator already holds (a selected
    client that trained the round but is not listed sends its upload again: its first
    copy went to a coordinator that crashed, or was lost while the broker restarted).
    ``announcement`` tells two announcements of one round apart; ``instance``, two runs
    of one run id (a device's state of another instance is not this run's).
    """

    round: int
    selected: tuple[str, ...]
    timeout_s: float
    params: Mapping[str, Number]
    attempt: int = 1
    uploaded: tuple[str, ...] = ()
    announcement: int = 0
    instance: str = ""

    def __post_init__(self) -> None:
        round_number(self.round, low=1)
        client_ids("selected", self.selected)
        client_ids("uploaded", self.uploaded)
        finite_number("timeout_s", self.timeout_s, low=0.0, high=MAX_TIMEOUT_S)
        _named_numbers("params", self.params)
        if not _is_int(self.attempt) or not 1 <= self.attempt <= 10_000:
            raise WireError(
                "range", f"attempt must be an integer in [1, 10000], got {self.attempt!r}"
            )
        if not _is_int(self.announcement) or not 0 <= self.announcement < 2**63:
            raise WireError("range", "announcement must be a non-negative 63-bit integer")
        run_instance(self.instance)

    def to_body(self) -> dict[str, object]:
        return {
            "selected": list(self.selected),
            "timeout_s": float(self.timeout_s),
            "params": dict(self.params),
            "attempt": self.attempt,
            "uploaded": list(self.uploaded),
            "announcement": self.announcement,
            **({"instance": self.instance} if self.instance else {}),
        }

    @classmethod
    def from_body(cls, t: int, body: Any) -> RoundStart:
        if not isinstance(body, Mapping):
            raise WireError("type", "a round start must be a map")
        body_keys(
            body,
            {"selected", "timeout_s", "params", "attempt", "uploaded", "announcement"},
            frozenset({"instance"}),
        )
        return cls(
            round=round_number(t, low=1),
            selected=client_ids("selected", body["selected"]),
            timeout_s=body["timeout_s"],
            params=_named_numbers("params", body["params"]),
            attempt=body["attempt"],
            uploaded=client_ids("uploaded", body["uploaded"]),
            announcement=body["announcement"],
            instance=run_instance(body.get("instance", "")),
        )

    def encode(self, run: str) -> bytes:
        return encode(Message("start", run, self.round, COORDINATOR, self.to_body()))


def read_start(raw: bytes, *, run_id: str, round: int) -> RoundStart:
    message = read_envelope(raw, "start", run_id, sender=COORDINATOR, round=round)
    return RoundStart.from_body(message.round, message.body)


@dataclass(frozen=True)
class RunStatus:
    """The retained state of the run, for late joiners; while a round is open it carries
    that round's start. ``throttled``: the devices that went past their message budget
    in this run (the coordinator's ``client.throttled``), for ``mqttfl watch``."""

    phase: RunPhase
    round: int
    start: RoundStart | None = None
    # When a finished run finished (Unix time): only shown to a person who reuses the run
    # id, never used to compute anything (clocks of devices may be off).
    finished_at: float | None = None
    throttled: tuple[str, ...] = ()
    instance: str = ""  # the run instance (RoundStart): which run of this run id
    # Why a finished run stopped before its last round ("": it ran them all).
    ended: str = ""
    # The digest of the run's manifest (its settings; "": not said): a device that took
    # its settings from another instance's manifest goes on where they are the same.
    settings: str = ""

    def __post_init__(self) -> None:
        run_instance(self.instance)
        text_field("ended", self.ended)
        settings_digest(self.settings)
        if self.ended and self.phase != "finished":
            raise WireError("range", "only a finished run says why it ended")
        if self.phase not in _PHASES:
            raise WireError("range", f"unknown run phase {str(self.phase)[:20]!r}")
        round_number(self.round)
        client_ids("throttled", self.throttled)
        if self.finished_at is not None:
            finite_number("finished_at", self.finished_at, low=0.0, high=MAX_UNIX_TIME)
        if (self.phase == "open") != (self.start is not None):
            raise WireError("range", "a run status carries a start exactly when a round is open")
        if self.start is not None and self.start.round != self.round:
            raise WireError("round_mismatch", "the open round's start is for another round")

    def encode(self, run: str) -> bytes:
        body: dict[str, object] = {"phase": self.phase}
        if self.start is not None:
            body["start"] = self.start.to_body()
        if self.finished_at is not None:
            body["finished_at"] = self.finished_at
        if self.throttled:
            body["throttled"] = list(self.throttled)
        if self.instance:
            body["instance"] = self.instance
        if self.ended:
            body["ended"] = self.ended
        if self.settings:
            body["settings"] = self.settings
        return encode(Message("state", run, self.round, COORDINATOR, body))


def read_run_status(raw: bytes, *, run_id: str) -> RunStatus:
    message = read_envelope(raw, "state", run_id, sender=COORDINATOR, round=None)
    body = message.body
    body_keys(
        body,
        {"phase"},
        frozenset({"start", "finished_at", "throttled", "instance", "ended", "settings"}),
    )
    start = RoundStart.from_body(message.round, body["start"]) if "start" in body else None
    throttled = client_ids("throttled", body.get("throttled", []))
    instance = run_instance(body.get("instance", ""))
    return RunStatus(
        body["phase"],
        round_number(message.round),
        start,
        body.get("finished_at"),
        throttled,
        instance,
        text_field("ended", body.get("ended", "")),
        settings_digest(body.get("settings", "")),
    )


# --- acknowledgement ------------------------------------------------------------------
@dataclass(frozen=True)
class Ack:
    """A selected client saw round ``round``'s start: it is alive and will train.

    With ``cannot_train`` set (a short reason code) it is the client's notice that it
    trained but will not upload round ``round`` (its own check refused the update), so
    the round need not wait for it (:mod:`mqttfl.engine.selection`)."""

    round: int
    client_id: str
    announcement: int = 0
    cannot_train: str = ""

    def __post_init__(self) -> None:
        round_number(self.round, low=1)
        check_id(self.client_id)
        if not _is_int(self.announcement) or not 0 <= self.announcement < 2**63:
            raise WireError("range", "announcement must be a non-negative 63-bit integer")
        text_field("cannot_train", self.cannot_train, MAX_KEY_CHARS)

    def encode(self, run: str) -> bytes:
        body: dict[str, object] = {"announcement": self.announcement}
        if self.cannot_train:
            body["cannot_train"] = self.cannot_train
        return encode(Message("ack", run, self.round, self.client_id, body))


def read_ack(raw: bytes, *, run_id: str, round: int, client: str) -> Ack:
    message = read_envelope(raw, "ack", run_id, sender=client, round=round)
    body = message.body
    body_keys(body, {"announcement"}, frozenset({"cannot_train"}))
    reason = text_field("cannot_train", body.get("cannot_train", ""), MAX_KEY_CHARS)
    if "cannot_train" in body and not reason:
        raise WireError("range", "'cannot_train' must name a reason")
    return Ack(message.round, client, body["announcement"], reason)


# --- metrics -----------------------------------------------------------------------------
METRIC_BOUNDS = {"accuracy": (0.0, 1.0), "f1": (0.0, 1.0), "mae": (0.0, 1e6)}
EXTRA_METRIC_BOUND = 1e12


@dataclass(frozen=True)
class Metrics:
    """One client's evaluation after applying round ``round``'s downlinks."""

    round: int
    client_id: str
    values: Mapping[str, Number]

    def __post_init__(self) -> None:
        round_number(self.round, low=1)
        check_id(self.client_id)
        _named_numbers("metrics", self.values, bound=EXTRA_METRIC_BOUND)
        for key, (low, high) in METRIC_BOUNDS.items():
            if key not in self.values:
                raise WireError("missing_field", f"metrics lack '{key}'")
            finite_number(key, self.values[key], low=low, high=high)

    def encode(self, run: str) -> bytes:
        return encode(Message("metrics", run, self.round, self.client_id, dict(self.values)))


def read_metrics(raw: bytes, *, run_id: str, round: int, client: str) -> Metrics:
    message = read_envelope(raw, "metrics", run_id, sender=client, round=round)
    return Metrics(message.round, client, _named_numbers("metrics", message.body))
