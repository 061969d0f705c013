"""What a sensor publishes: its readings, its availability and a Home Assistant
MQTT discovery config, so the count shows up as a sensor entity with no YAML. The
topics are :mod:`mqttfl.wire.sensors`'s.

The config names ``state_topic`` (the one field Home Assistant's MQTT sensor requires),
a ``value_template`` that reads the count, the ``availability_topic`` with its payloads,
a ``unique_id`` and the ``device`` (its ``identifiers``, as discovery needs for the
device registry), and the state's JSON as attributes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata

from mqttfl.sensing.model import Reading
from mqttfl.sensing.spec import SensorSpec
from mqttfl.wire.sensors import OBJECT_ID, SensorTopics

ONLINE, OFFLINE = b"online", b"offline"


def package_version() -> str:
    try:
        return metadata.version("mqttfl")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def default_name(spec: SensorSpec) -> str:
    run_id = str(spec.run.get("run_id") or "mqttfl")
    client = str(spec.run.get("client_id") or "0")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-client-{client}")[:64]


def discovery_config(spec: SensorSpec, topics: SensorTopics, version: str) -> dict[str, object]:
    """Home Assistant's MQTT discovery payload for the count sensor."""
    run = {key: str(value)[:80] for key, value in spec.run.items()}
    people = all(c is not None for c in spec.counts)
    config: dict[str, object] = {
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


def state_message(reading: Reading) -> dict[str, object]:
    """A reading's JSON (also Home Assistant's attributes); a model that adapts adds
    ``adapted`` (whether this reading's model was adapted to the session),
    ``shift_score`` (how far the buffer's windows moved from the training windows) and
    ``fit_ratio`` (the gate's statistic: it adapts where the ratio reaches its threshold);
    both null without a gate or before the buffer holds ``min_adapt_windows``."""
    count: float | int = int(reading.count) if reading.count.is_integer() else reading.count
    state: dict[str, object] = {
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


def encode(payload: Mapping[str, object]) -> bytes:
    """Strict JSON: a NaN or infinity raises ValueError (the runner never publishes one)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
