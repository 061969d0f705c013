"""What a sensor publishes: its readings, its availability and a Home Assistant
MQTT discovery config, so the count shows up as a sensor entity with no YAML.

Topics, for a sensor named NAME (``--name``, default ``<run_id>-client-<id>``):

* ``mqttfl/sensor/NAME/state``: one JSON object per window (QoS 0, not retained);
* ``mqttfl/sensor/NAME/availability``: ``online`` (retained, on every connect once the
  sensor reads its input: for ``mqtt:TOPIC``, once subscribed) and ``offline``
  (retained, on every way out, and as the connection's last will);
* ``homeassistant/sensor/NODE/people_count/config``: the retained discovery config
  (``--discovery-prefix`` instead of ``homeassistant``).

NODE is also the MQTT client id's tail (``mqttfl-sense-NODE``) and Home Assistant's
``unique_id``; it may hold only ``[A-Za-z0-9_-]``. It is NAME itself when NAME has no
other character and does not end like a hashed node id; otherwise NAME with each ``.``
replaced by ``_``, then ``__`` and the first 8 hex digits of the SHA-256 of NAME
(``kitchen.1`` is ``kitchen_1__296906f4``). So two names never share a client id or a
discovery topic: ``kitchen_1`` and ``kitchen.1`` on one broker are two sensors, not one
session taken over by turns.

The config names ``state_topic`` (the one field Home Assistant's MQTT sensor requires),
a ``value_template`` that reads the count, the ``availability_topic`` with its payloads,
a ``unique_id`` and the ``device`` (its ``identifiers``, as discovery needs for the
device registry), and the state's JSON as attributes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from mqttfl.sensing.model import Reading
from mqttfl.sensing.spec import SensorSpec

STATE_PREFIX = "mqttfl/sensor"
DISCOVERY_PREFIX = "homeassistant"
OBJECT_ID = "people_count"
ONLINE, OFFLINE = b"online", b"offline"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE = re.compile(r"[A-Za-z0-9_-]+")
_HASHED = re.compile(r".*__[0-9a-f]{8}")  # what node_id() appends: no name's own id
# A discovery prefix: topic levels of these characters, joined by '/' (no wildcard, no
# '$' topic of the broker's own, no empty level).
_PREFIX = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")
MAX_PREFIX = 128


def package_version() -> str:
    try:
        return metadata.version("mqttfl")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted on one line, cut to ``limit`` characters (a hostile value may be
    70,000 characters long or hold a newline)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_name(name: str) -> str:
    """A sensor name: letters, digits, ``_ . -``, at most 64 (it goes into topics)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"--name {shown(name)}: use 1-64 letters, digits, '_', '.' or '-' (it goes into topics)"
        )
    return name


def check_discovery_prefix(prefix: str) -> str:
    """Home Assistant's discovery prefix: topic levels of letters, digits, ``_ . -``
    joined by ``/``, at most 128 characters (no wildcard, no ``$`` topic)."""
    if len(prefix) > MAX_PREFIX or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"--discovery-prefix {shown(prefix)}: use at most {MAX_PREFIX} letters, digits, "
            "'_', '.' or '-' in levels joined by '/' (no wildcard '+' or '#', no empty level)"
        )
    return prefix


def node_id(name: str) -> str:
    """The sensor's id in its client id and discovery topic: one to one with the name."""
    if _NODE.fullmatch(name) and not _HASHED.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)}__{digest}"


def default_name(spec: SensorSpec) -> str:
    run_id = str(spec.run.get("run_id") or "mqttfl")
    client = str(spec.run.get("client_id") or "0")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-client-{client}")[:64]


@dataclass(frozen=True)
class SensorTopics:
    """The topics of one sensor; ValueError (one line) for a name or prefix no topic can
    hold."""

    name: str
    discovery_prefix: str = DISCOVERY_PREFIX

    def __post_init__(self) -> None:
        check_name(self.name)
        check_discovery_prefix(self.discovery_prefix)

    @property
    def node_id(self) -> str:
        return node_id(self.name)

    @property
    def client_id(self) -> str:
        return f"mqttfl-sense-{self.node_id}"

    @property
    def base(self) -> str:
        return f"{STATE_PREFIX}/{self.name}"

    @property
    def state(self) -> str:
        return f"{self.base}/state"

    @property
    def availability(self) -> str:
        return f"{self.base}/availability"

    @property
    def discovery(self) -> str:
        return f"{self.discovery_prefix}/sensor/{self.node_id}/{OBJECT_ID}/config"


def discovery_config(spec: SensorSpec, topics: SensorTopics, version: str) -> dict[str, Any]:
    """Home Assistant's MQTT discovery payload for the count sensor."""
    run = {key: str(value)[:80] for key, value in spec.run.items()}
    people = all(c is not None for c in spec.counts)
    config: dict[str, Any] = {
        "name": "People count" if people else "Activity class",
        "unique_id": f"mqttfl_{topics.node_id}_{OBJECT_ID}",
        "state_topic": topics.state,
        "value_template": "{{ value_json.count }}",
        "json_attributes_topic": topics.state,
        "availability_topic": topics.availability,
        "payload_available": ONLINE.decode(),
        "payload_not_available": OFFLINE.decode(),
        "state_class": "measurement",
        "icon": "mdi:account-group",
        "device": {
            "identifiers": [f"mqttfl_{topics.node_id}"],
            "name": topics.name,
            "manufacturer": "mqttfl",
            "model": f"{run.get('arch', '?')} ({run.get('method', '?')}, run {run.get('run_id', '?')})",
            "sw_version": version,
        },
        "origin": {"name": "mqttfl", "sw_version": version},
    }
    if people:
        config["unit_of_measurement"] = "people"
    return config


def iso_time(seconds: float) -> str:
    """``seconds`` since the epoch as ISO 8601 UTC; a frame's own time is checked before
    it gets here (:func:`mqttfl.sensing.gateway.frame_time`)."""
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def state_message(reading: Reading) -> dict[str, Any]:
    """A reading's JSON (also Home Assistant's attributes); a model that adapts adds
    ``adapted`` (whether this reading's model was adapted to the session),
    ``shift_score`` (how far the buffer's windows moved from the training windows) and
    ``fit_ratio`` (the gate's statistic: it adapts where the ratio reaches its threshold);
    both null without a gate or before the buffer holds ``min_adapt_windows``."""
    count: float | int = int(reading.count) if reading.count.is_integer() else reading.count
    state: dict[str, Any] = {
        "count": count,
        "class": reading.label,
        "confidence": round(reading.confidence, 4),
        "window_end": iso_time(reading.end_time),
    }
    if reading.adapted is not None:
        state["adapted"] = reading.adapted
        state["shift_score"] = _rounded(reading.shift_score)
        state["fit_ratio"] = _rounded(reading.fit_ratio)
    return state


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def encode(payload: dict[str, Any]) -> bytes:
    """Strict JSON: a NaN or infinity raises ValueError (the runner never publishes one)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
