"""Where a sensor's windows come from (``--input``): one class per kind of source.

* :class:`CaptureSource`: a capture file in any ``data prepare`` format (the default);
* :class:`MqttSource` (``mqtt:TOPIC``): a gateway's frames, one packet per message;
* :class:`ShardSource` (``shard:PATH``): a shard's test split, windows ready for the model.

:func:`parse_source` reads ``--input``; the sensor takes a :data:`Source` apart with one
``match`` (:mod:`.runner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mqttfl.errors import UsageError
from mqttfl.wire.sensors import shown

MAX_TOPIC_BYTES = 65_535  # MQTT's limit on a topic


@dataclass(frozen=True)
class CaptureSource:
    kind: ClassVar[str] = "capture"  # for logs only
    target: str  # the capture file's path


@dataclass(frozen=True)
class MqttSource:
    kind: ClassVar[str] = "mqtt"
    target: str  # the gateway's topic: one, printable, no wildcards

    def __post_init__(self) -> None:
        topic = self.target
        if (
            not topic
            or any(c in topic for c in "#+\0")
            or not topic.isprintable()
            or len(topic.encode("utf-8", "replace")) > MAX_TOPIC_BYTES
        ):
            raise UsageError(
                f"--input {shown('mqtt:' + topic)}: name one topic after mqtt: (printable, at "
                f"most {MAX_TOPIC_BYTES} bytes, no wildcards)"
            )


@dataclass(frozen=True)
class ShardSource:
    kind: ClassVar[str] = "shard"
    target: str  # the shard's path


Source = CaptureSource | MqttSource | ShardSource


def parse_source(text: str) -> Source:
    """``mqtt:TOPIC``, ``shard:PATH``, or else the path of a capture file."""
    match text.partition(":"):
        case ("mqtt", ":", topic):
            return MqttSource(topic)
        case ("shard", ":", path):
            return ShardSource(path)
        case _:
            return CaptureSource(text)
