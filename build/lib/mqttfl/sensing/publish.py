"""What a sensor publishes: its readings, its availability and a Home Assistant
MQTT discovery config, so the count shows up as a sensor entity with no YAML.

Topics, for a sensor named NAME (``--name``, default ``<run_id>-client-<id>``):

* ``mqttfl/sensor/NAME/state``: one JSON object per window (not retained);
* ``mqttfl/sensor/NAME/availability``: ``online`` (retained, on every connect) and
  ``offline`` (retained, on exit, and as the connection's last will);
* ``homeassistant/sensor/NODE/people_count/config``: the retained discovery config
  (NODE: NAME with every character outside ``[A-Za-z0-9_-]`` replaced by ``_``).

The config names ``state_topic`` (the one field Home Assistant's MQTT sensor requires),
a ``value_template`` that reads the count, the ``availability_topic`` with its payloads,
a ``unique_id`` and the ``device`` (its ``identifiers``, as discovery needs for the
device registry), and the state's JSON as attributes.
"""

from __future__ import annotations

import json
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
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def package_version() -> str:
    try:
        return metadata.version("mqttfl")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def check_name(name: str) -> str:
    """A sensor name: letters, digits, ``_ . -``, at most 64 (it goes into topics)."""
    if not _NAME.match(name):
        raise ValueError(
            f"--name {name!r}: use 1-64 letters, digits, '_', '.' or '-' (it goes into topics)"
        )
    return name


def default_name(spec: SensorSpec) -> str:
    run_id = str(spec.run.get("run_id") or "mqttfl")
    client = str(spec.run.get("client_id") or "0")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-client-{client}")[:64]


@dataclass(frozen=True)
class SensorTopics:
    name: str
    discovery_prefix: str = DISCOVERY_PREFIX

    @property
    def node_id(self) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", self.name)

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
    run = spec.run
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
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def state_message(reading: Reading) -> dict[str, Any]:
    count: float | int = int(reading.count) if reading.count.is_integer() else reading.count
    return {
        "count": count,
        "class": reading.label,
        "confidence": round(reading.confidence, 4),
        "window_end": iso_time(reading.end_time),
    }


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()
