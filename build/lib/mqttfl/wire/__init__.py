"""The wire: topics, the msgpack codec and payload schemas. Imports nothing of the runtime."""

from mqttfl.wire.codec import SCHEMA_VERSION, Message, decode, encode
from mqttfl.wire.ids import BROADCAST, check_id
from mqttfl.wire.schemas import EMPTY, ArrayField, FloatField, IntField, PayloadSchema
from mqttfl.wire.topics import TopicInfo, Topics

__all__ = [
    "BROADCAST",
    "EMPTY",
    "SCHEMA_VERSION",
    "ArrayField",
    "FloatField",
    "IntField",
    "Message",
    "PayloadSchema",
    "TopicInfo",
    "Topics",
    "check_id",
    "decode",
    "encode",
]
