"""The bytes a run counts as sent down, chunk framing included (``broker.max_message_bytes``):
each live client's personal downlink, and the broadcast of every client that receives it.

Where clients fetch the broadcast only when they use it
(:meth:`~mqttfl.algorithms.base.Algorithm.fetched_on_demand`), a round's broadcast counts
for the clients chosen in it (and for every client at the run's last round, which all
score), and once more for each client chosen for the next round that does not hold it.
"""

from __future__ import annotations

from collections.abc import Collection

from mqttfl.config import RunConfig
from mqttfl.engine.state import RunState
from mqttfl.wire import Topics
from mqttfl.wire.chunks import framed_size, payload_budget
from mqttfl.wire.downlinks import DownlinkPayloads


class DownBytes:
    def __init__(self, config: RunConfig, state: RunState, *, on_demand: bool) -> None:
        self.state = state
        self.topics = Topics(config.run_id)
        self.limit = config.broker.max_message_bytes
        self.rounds = config.rounds
        self.on_demand = on_demand
        self.holders: set[str] = set()  # the clients that hold the newest broadcast

    def closed(
        self, t: int, payloads: DownlinkPayloads, live: list[str], chosen: Collection[str]
    ) -> None:
        comm = self.state.comm
        self.holders = set(live)
        if self.on_demand and t < self.rounds:
            self.holders &= set(chosen)
        broadcast = self.wire(len(payloads.broadcast), self.topics.down_all(t))
        for client in live:
            personal = payloads.personal.get(client, b"")
            comm["down_bytes"] += self.wire(len(personal), self.topics.down(t, client))
            comm["down_bytes"] += broadcast if client in self.holders else 0
            comm["down_count"] += 1

    def chosen(self, t: int, selected: Collection[str]) -> None:
        """Round t's clients are chosen: those without round t-1's broadcast fetch it."""
        held = self.state.downlinks
        if not self.on_demand or held is None or t == 1:
            return
        fetching = set(selected) - self.holders
        size = self.wire(len(held.broadcast), self.topics.down_all(t - 1))
        self.state.comm["down_bytes"] += size * len(fetching)
        self.holders |= fetching

    def wire(self, size: int, topic: str) -> int:
        """Bytes a payload takes on the wire, chunk framing included."""
        return framed_size(size, payload_budget(self.limit, topic)) if self.limit else size
