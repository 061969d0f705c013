"""MQTT topic layout of a sensing device (`mqttfl sense`), and its identities on a broker.

Topics, for a sensor named NAME (``--name``, default ``<run_id>-client-<id>``):

* ``mqttfl/sensor/NAME/state``: one JSON object per window (QoS 0, not retained);
* ``mqttfl/sensor/NAME/availability``: ``online`` (retained, on every connect once the
  sensor reads its input: for ``mqtt:TOPIC``, once subscribed) and ``offline``
  (retained, on every way out, and as the connection's last will);
* ``homeassistant/sensor/NODE/people_count/config``: the retained discovery config
  (``--discovery-prefix`` instead of ``homeassistant``);
* ``csi/NAME``: its gateway's frames, on a broker from ``broker init --sensors NAME``
  (``--input mqtt:csi/NAME``; elsewhere ``--input`` names any topic).

NODE is also the MQTT client id's tail (``mqttfl-sense-NODE``) and Home Assistant's
``unique_id``; it may hold only ``[A-Za-z0-9_-]``. It is NAME itself when NAME has no
other character and does not end like a hashed node id; otherwise NAME with each ``.``
replaced by ``_``, then ``__`` and the first 8 hex digits of the SHA-256 of NAME
(``kitchen.1`` is ``kitchen_1__296906f4``). So two names never share a client id or a
discovery topic: ``kitchen_1`` and ``kitchen.1`` on one broker are two sensors, not one
session taken over by turns.

On a broker from ``broker init --sensors NAME`` the sensor logs in as ``sensor-NAME``,
which may write only its state, availability and discovery config (default prefix) and
read ``csi/NAME``; its gateway logs in as ``gateway-NAME``, which may write only
``csi/NAME``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

STATE_PREFIX = "mqttfl/sensor"
DISCOVERY_PREFIX = "homeassistant"
FRAMES_PREFIX = "csi"
OBJECT_ID = "people_count"
SENSOR_IDENTITY = "sensor-"  # + NAME: a sensing device's user name
GATEWAY_IDENTITY = "gateway-"  # + NAME: the user name of the gateway feeding it frames
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE = re.compile(r"[A-Za-z0-9_-]+")
_HASHED = re.compile(r".*__[0-9a-f]{8}")  # what node_id() appends: no name's own id
# A discovery prefix: topic levels of these characters, joined by '/' (no wildcard, no
# '$' topic of the broker's own, no empty level).
_PREFIX = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")
MAX_PREFIX = 128


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted on one line, cut to ``limit`` characters (a hostile value may be
    70,000 characters long or hold a newline)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_name(name: str, what: str = "--name") -> str:
    """A sensor name: letters, digits, ``_ . -``, at most 64 (it goes into topics)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{what} {shown(name)}: use 1-64 letters, digits, '_', '.' or '-' (it goes into topics)"
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


def sensor_identity(name: str) -> str:
    return SENSOR_IDENTITY + check_name(name)


def gateway_identity(name: str) -> str:
    return GATEWAY_IDENTITY + check_name(name)


def sensor_of(username: str | None) -> str | None:
    """The sensor name a ``sensor-NAME`` user name stands for, or None."""
    if username is None or not username.startswith(SENSOR_IDENTITY):
        return None
    name = username[len(SENSOR_IDENTITY) :]
    return name if _NAME.fullmatch(name) else None


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

    @property
    def frames(self) -> str:
        """Where its gateway's frames go on a broker from ``broker init --sensors``."""
        return f"{FRAMES_PREFIX}/{self.name}"
