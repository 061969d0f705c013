"""Who a sensing device is on a broker from ``broker init --sensors NAME``, in the lines
a refusal prints: where its credentials come from (a refused login) and what its
identity may publish (a refused publish), instead of a training client's words."""

from __future__ import annotations

from dataclasses import replace

from mqttfl.bus.address import Credentials
from mqttfl.wire.sensors import DISCOVERY_PREFIX, SensorTopics, sensor_identity, sensor_of


def sensor_credentials(credentials: Credentials | None, topics: SensorTopics) -> Credentials:
    """``credentials`` with the origin a refused login names: the sensor's own file."""
    user = sensor_identity(topics.name)
    origin = (
        "sense takes its user name and password from MQTTFL_BROKER__USERNAME and "
        f"MQTTFL_BROKER__PASSWORD: on this device run `set -a; . ./{user}.env; set +a` "
        f"with the credentials/{user}.env that `mqttfl broker init --sensors {topics.name}` "
        "wrote"
    )
    return replace(credentials or Credentials(), origin=origin)


def refusal_hint(username: str | None, topics: SensorTopics) -> str:
    """Why the broker likely refused this sensor a publish, and what to change."""
    own = sensor_of(username)
    if own is None:
        return (
            f"{'user ' + repr(username) if username else 'an anonymous login'} is not a "
            "sensor identity: a sensing device logs in with the credentials/sensor-NAME.env "
            "that `mqttfl broker init --sensors NAME` wrote"
        )
    mine = SensorTopics(own)
    if own != topics.name:
        return (
            f"the sensor identity {own!r} may publish only under {mine.base}/ and "
            f"{mine.discovery}: start sense with --name {own}"
        )
    if topics.discovery_prefix != DISCOVERY_PREFIX:
        return (
            f"the sensor identity {own!r} may publish its discovery config only to "
            f"{mine.discovery}: start sense without --discovery-prefix"
        )
    return (
        f"the broker's ACL does not give the sensor identity {own!r} its topics: was it "
        f"written by `mqttfl broker init --sensors {own}`?"
    )


def frames_note(username: str | None, topics: SensorTopics, topic: str) -> str | None:
    """A line when a sensor identity reads frames from a topic its ACL does not give it
    (the broker grants the subscription and delivers nothing)."""
    own = sensor_of(username)
    if own is None or topic == SensorTopics(own).frames:
        return None
    return (
        f"the sensor identity {own!r} may read only {SensorTopics(own).frames} on a broker "
        f"from `broker init --sensors`: frames on {topic} will not reach it"
    )
