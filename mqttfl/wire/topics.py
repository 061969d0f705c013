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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mqttfl.errors import WireError
from mqttfl.wire.ids import BROADCAST, check_id

MAX_ROUND = 999_999_999  # nine ASCII digits in a topic
MAX_TOPIC_CHARS = 512
_ROUND = re.compile(r"^(0|[1-9][0-9]{0,8})$")  # ASCII only: str.isdigit() takes '²'
_PER_CLIENT = ("down", "up", "metrics", "ack")


@dataclass(frozen=True)
class TopicInfo:
    kind: str  # start | down | ack | up | metrics | status | state | site | lease
    round: int | None
    client: str | None  # None for start/state; "all" for the broadcast downlink


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
        parts = topic[len(prefix) :].split("/")
        if parts == ["state"]:
            return TopicInfo("state", None, None)
        if parts == ["lease"]:
            return TopicInfo("lease", None, None)
        if len(parts) == 2 and parts[0] == "status":
            return TopicInfo("status", None, check_id(parts[1]))
        if len(parts) == 2 and parts[0] == "site":
            return TopicInfo("site", None, check_id(parts[1], "site"))
        if len(parts) >= 3 and parts[0] == "round" and _ROUND.fullmatch(parts[1]):
            t = int(parts[1])
            if parts[2:] == ["start"]:
                return TopicInfo("start", t, None)
            if len(parts) == 4 and parts[2] in _PER_CLIENT:
                if parts[2] == "down" and parts[3] == BROADCAST:
                    return TopicInfo("down", t, BROADCAST)
                return TopicInfo(parts[2], t, check_id(parts[3]))
        raise WireError("topic", f"unknown topic: {topic[:100]!r}")
