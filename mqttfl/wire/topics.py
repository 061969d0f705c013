"""MQTT topic layout of one run.

The round number sits in every per-round topic, so a late upload is recognisably stale
from its topic alone, before its payload is even decoded.

    mqttfl/{run}/round/{t}/start             coordinator -> all: selection, deadline, params
    mqttfl/{run}/round/{t}/down/{client}     personalized downlink
    mqttfl/{run}/round/{t}/down/all          broadcast downlink (also marks the round closed)
    mqttfl/{run}/round/{t}/ack/{client}      a selected client saw the start (it is alive)
    mqttfl/{run}/round/{t}/up/{client}       upload
    mqttfl/{run}/round/{t}/metrics/{client}  per-round metrics
    mqttfl/{run}/status/{client}             retained online status, last will offline
    mqttfl/{run}/state                       retained run state for late joiners
    mqttfl/{run}/site/{site}                 a site bridge's notice: 1 connected, 0 gone (its will)
    mqttfl/{run}/lease                       retained: the run's live coordinator (its will: gone)

:meth:`Topics.parse` turns a topic into one of the classes of :data:`TopicInfo`, each
holding exactly the levels its kind has (already checked), so a reader takes it apart
with one ``match``::

    match topics.parse(message.topic):
        case UploadTopic(t, client): ...
        case StatusTopic(client): ...
        case other: raise WireError("topic", f"not taken here: {other.kind} messages")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from mqttfl.errors import WireError
from mqttfl.wire.ids import BROADCAST, check_id

MAX_ROUND = 999_999_999  # nine ASCII digits in a topic
MAX_TOPIC_CHARS = 512
_ROUND = re.compile(r"^(0|[1-9][0-9]{0,8})$")  # ASCII only: str.isdigit() takes '²'


@dataclass(frozen=True)
class StartTopic:
    """``round/{t}/start``: the coordinator opens round ``t``."""

    kind: ClassVar[str] = "start"  # the topic level, for messages and logs only
    round: int


@dataclass(frozen=True)
class DownTopic:
    """``round/{t}/down/{client}``: a personal downlink, or ``client == BROADCAST``."""

    kind: ClassVar[str] = "down"
    round: int
    client: str  # a client id, or BROADCAST ("all")

    @property
    def broadcast(self) -> bool:
        return self.client == BROADCAST


@dataclass(frozen=True)
class AckTopic:
    """``round/{t}/ack/{client}``: a selected client saw the start."""

    kind: ClassVar[str] = "ack"
    round: int
    client: str


@dataclass(frozen=True)
class UploadTopic:
    """``round/{t}/up/{client}``: a client's upload."""

    kind: ClassVar[str] = "up"
    round: int
    client: str


@dataclass(frozen=True)
class MetricsTopic:
    """``round/{t}/metrics/{client}``: a client's metrics of round ``t``."""

    kind: ClassVar[str] = "metrics"
    round: int
    client: str


@dataclass(frozen=True)
class StatusTopic:
    """``status/{client}``: a client's retained status (its will: offline)."""

    kind: ClassVar[str] = "status"
    client: str


@dataclass(frozen=True)
class StateTopic:
    """``state``: the retained run state."""

    kind: ClassVar[str] = "state"


@dataclass(frozen=True)
class SiteTopic:
    """``site/{site}``: a site bridge's notice."""

    kind: ClassVar[str] = "site"
    site: str


@dataclass(frozen=True)
class LeaseTopic:
    """``lease``: the run's live coordinator."""

    kind: ClassVar[str] = "lease"


@dataclass(frozen=True)
class ManifestTopic:
    """``manifest``: the run's contract, retained (:mod:`mqttfl.wire.manifest`)."""

    kind: ClassVar[str] = "manifest"


#: A parsed topic of the run: one class per kind, each field checked by the parser.
TopicInfo = (
    StartTopic
    | DownTopic
    | AckTopic
    | UploadTopic
    | MetricsTopic
    | StatusTopic
    | StateTopic
    | SiteTopic
    | LeaseTopic
    | ManifestTopic
)
_PER_CLIENT: dict[str, type[DownTopic | AckTopic | UploadTopic | MetricsTopic]] = {
    cls.kind: cls for cls in (DownTopic, AckTopic, UploadTopic, MetricsTopic)
}


@dataclass(frozen=True)
class Topics:
    run_id: str
    prefix: str = "mqttfl"

    def __post_init__(self) -> None:
        check_id(self.run_id, "run id")

    @property
    def base(self) -> str:
        return f"{self.prefix}/{self.run_id}"

    def start(self, t: int) -> str:
        return f"{self.base}/round/{t}/start"

    def down(self, t: int, client: str) -> str:
        return f"{self.base}/round/{t}/down/{client}"

    def down_all(self, t: int) -> str:
        return f"{self.base}/round/{t}/down/{BROADCAST}"

    def up(self, t: int, client: str) -> str:
        return f"{self.base}/round/{t}/up/{client}"

    def ack(self, t: int, client: str) -> str:
        return f"{self.base}/round/{t}/ack/{client}"

    def metrics(self, t: int, client: str) -> str:
        return f"{self.base}/round/{t}/metrics/{client}"

    def status(self, client: str) -> str:
        return f"{self.base}/status/{client}"

    @property
    def state(self) -> str:
        return f"{self.base}/state"

    @property
    def lease(self) -> str:
        return f"{self.base}/lease"

    @property
    def manifest(self) -> str:
        return f"{self.base}/manifest"

    @property
    def everything(self) -> str:
        return f"{self.base}/#"

    def site(self, site: str) -> str:
        return f"{self.base}/site/{site}"

    @property
    def any_site(self) -> str:
        return f"{self.base}/site/+"

    # Subscriptions
    @property
    def any_start(self) -> str:
        return f"{self.base}/round/+/start"

    @property
    def any_up(self) -> str:
        return f"{self.base}/round/+/up/+"

    @property
    def any_ack(self) -> str:
        return f"{self.base}/round/+/ack/+"

    @property
    def any_metrics(self) -> str:
        return f"{self.base}/round/+/metrics/+"

    @property
    def any_status(self) -> str:
        return f"{self.base}/status/+"

    def any_down_for(self, client: str) -> str:
        return f"{self.base}/round/+/down/{client}"

    @property
    def any_down_all(self) -> str:
        return f"{self.base}/round/+/down/{BROADCAST}"

    def parse(self, topic: str) -> TopicInfo:
        """Split a topic of this run; raise WireError('topic') for anything else.

        The round is one to nine ASCII digits without a leading zero, and a client level
        is a valid id (or ``all`` for the broadcast downlink), so nothing hostile in a
        topic reaches ``int()`` or a file name.
        """
        prefix = self.base + "/"
        if len(topic) > MAX_TOPIC_CHARS or not topic.startswith(prefix):
            raise WireError("topic", f"not a topic of run {self.run_id}: {topic[:100]!r}")
        match topic[len(prefix) :].split("/"):
            case ["state"]:
                return StateTopic()
            case ["lease"]:
                return LeaseTopic()
            case ["manifest"]:
                return ManifestTopic()
            case ["status", client]:
                return StatusTopic(check_id(client))
            case ["site", site]:
                return SiteTopic(check_id(site, "site"))
            case ["round", t, "start"] if _ROUND.fullmatch(t):
                return StartTopic(int(t))
            case ["round", t, "down", client] if _ROUND.fullmatch(t) and client == BROADCAST:
                return DownTopic(int(t), BROADCAST)
            case ["round", t, kind, client] if _ROUND.fullmatch(t) and kind in _PER_CLIENT:
                return _PER_CLIENT[kind](int(t), check_id(client))
        raise WireError("topic", f"unknown topic: {topic[:100]!r}")
