"""Sensing devices on a broker from ``broker init --sensors kitchen,hall``.

Each sensor NAME gets two identities (:mod:`mqttfl.wire.sensors` names them and its
topics):

    sensor-NAME    `mqttfl sense --name NAME`: writes its state, its availability (and
                   last will) and its Home Assistant discovery config (the default
                   prefix), reads its gateway's frames on csi/NAME
    gateway-NAME   what feeds that sensor frames: writes csi/NAME, nothing else

Neither may touch a federation's run topics, nor another sensor's. The watch identities
read every sensor's state, availability and discovery config (Home Assistant can log in
as one).
"""

from __future__ import annotations

from mqttfl.errors import UsageError
from mqttfl.wire.sensors import (
    DISCOVERY_PREFIX,
    STATE_PREFIX,
    SensorTopics,
    check_name,
    gateway_identity,
    sensor_identity,
)


def sensor_names(text: str | None) -> list[str]:
    """``--sensors kitchen,hall`` as names; UsageError naming the first bad one."""
    if text is None:
        return []
    names = [s.strip() for s in text.split(",")]
    for name in names:
        try:
            check_name(name, "--sensors: sensor name")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if len(set(names)) != len(names):
        raise UsageError(f"--sensors {text!r} names a sensor twice")
    return names


def sensor_identities(names: list[str]) -> list[str]:
    """The user names of these sensors and their gateways, in the ACL's order."""
    return [who for name in names for who in (sensor_identity(name), gateway_identity(name))]


def sensor_acl(name: str) -> list[str]:
    """The ACL lines of one sensor's two identities (each block ends with a blank line)."""
    topics = SensorTopics(name)
    return [
        f"user {sensor_identity(name)}",
        f"topic write {topics.state}",
        f"topic write {topics.availability}",
        f"topic write {topics.discovery}",
        f"topic read {topics.frames}",
        "",
        f"user {gateway_identity(name)}",
        f"topic write {topics.frames}",
        "",
    ]


def sensor_readers() -> list[str]:
    """What a watch identity reads of the sensors: every one's readings and discovery."""
    return [f"topic read {STATE_PREFIX}/#", f"topic read {DISCOVERY_PREFIX}/sensor/#"]
