"""The coordinator's screen: which messages it reads, holds back or drops, before decoding.

Every message is charged to its sender's budget (:mod:`mqttfl.engine.budget`), cheapest
checks first:

- a topic that is not the run's, an upload the open round does not wait for (a past or
  future round, a repeat of an accepted one), metrics of a round their sender has reported
  already: refused in O(1) from the topic alone, counted with their reason, never
  decoded; logged while the sender is within its ``noise`` budget;
- a status, a site notice (each replaces the one before it): read within the sender's
  ``state`` budget; past it the newest one per sender is held until the flood is over
  (the sender quiet for QUIET_S), so a flood of them costs one held message per sender,
  cannot flip a device offline while it trains, and the last one counts;
- the lease (at most 4 KB of JSON): always read, so that a rival coordinator's lease is
  seen in any flood of forged ones; what the coordinator publishes in answer is what is
  budgeted (:class:`~mqttfl.nodes.coordinator.Coordinator`);
- everything else (an acknowledgement, metrics, an upload the round waits for) is read
  within the sender's ``work`` budget; past it, dropped and counted as ``throttled``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from mqttfl.bus.transport import Incoming
from mqttfl.engine.budget import MAX_SENDERS, UNNAMED, SenderBudget
from mqttfl.engine.rounds import RoundEngine
from mqttfl.errors import RejectedUpload, WireError
from mqttfl.wire import Topics
from mqttfl.wire.ids import client_order
from mqttfl.wire.topics import (
    AckTopic,
    DownTopic,
    LeaseTopic,
    ManifestTopic,
    MetricsTopic,
    SiteTopic,
    StartTopic,
    StateTopic,
    StatusTopic,
    TopicInfo,
    UploadTopic,
)

LEASE = "/lease"  # the lease topic's sender key (never a client id: ids hold no '/')
Verdict = Literal["read", "drop"]


def sender_of(where: TopicInfo) -> str:
    """Whose budget a message is charged to: a client id, a site, the lease, or nobody."""
    match where:
        case SiteTopic(site):
            return f"site/{site}"
        case LeaseTopic():
            return LEASE
        case StartTopic() | StateTopic() | ManifestTopic():
            return UNNAMED
        case StatusTopic(client) | DownTopic(_, client) | AckTopic(_, client):
            return client
        case UploadTopic(_, client) | MetricsTopic(_, client):
            return client


class Screen:
    def __init__(
        self,
        engine: RoundEngine,
        topics: Topics,
        clock: Callable[[], float],
        *,
        max_senders: int = MAX_SENDERS,
    ) -> None:
        self.engine, self.topics, self.clock = engine, topics, clock
        self.budget = SenderBudget(clock, max_senders=max_senders)
        self.max_held = max_senders
        self.held: dict[str, Incoming] = {}  # the newest state message per sender
        self.next_release = math.inf
        self.quiet = False  # the message being handled is past its sender's noise budget

    def where(self, message: Incoming) -> TopicInfo:
        """The message's topic, parsed (a topic not of this run is charged as noise)."""
        self.quiet = False
        try:
            return self.topics.parse(message.topic)
        except WireError:
            self.quiet = not self.budget.admit(UNNAMED, "noise")
            raise

    def admit(self, where: TopicInfo, message: Incoming) -> Verdict:
        """``read`` it now, or ``drop`` it (held back, or throttled); raises WireError
        (RejectedUpload for uploads) for what the O(1) checks refuse."""
        sender = sender_of(where)
        if isinstance(where, LeaseTopic):
            return "read"
        if isinstance(where, StatusTopic | SiteTopic):  # each replaces the one before it
            admitted = self.budget.admit(sender, "state")  # (a flood goes on while it fails)
            if admitted and self.budget.quiet_at(sender) <= self.clock():
                self.held.pop(sender, None)
                return "read"
            self._hold(sender, message)
            return "drop"
        self._refuse(where, message)
        if self.budget.admit(sender, "work"):
            return "read"
        self.engine.state.rejected_messages["throttled"] += 1
        return "drop"

    def _refuse(self, where: TopicInfo, message: Incoming) -> None:
        """The O(1) checks: raise for what is refused, return for a message worth decoding."""
        if message.error is not None:
            return
        engine = self.engine
        try:
            match where:
                case UploadTopic(t, client):
                    try:
                        engine.gate.screen(t, client, len(message.payload))
                    except RejectedUpload as exc:
                        exc.round, exc.client = t, client
                        raise
                case MetricsTopic(t, client) if engine.metrics_repeat(t, client):
                    raise WireError(
                        "duplicate", f"client {client!r} already reported its metrics of round {t}"
                    )
        except WireError:
            self.quiet = not self.budget.admit(sender_of(where), "noise")
            raise

    def _hold(self, sender: str, message: Incoming) -> None:
        if sender not in self.held and len(self.held) >= self.max_held:
            self.engine.state.rejected_messages["throttled"] += 1
            return
        self.held[sender] = message
        self.next_release = min(self.next_release, self._ready_at(sender))

    def _ready_at(self, sender: str) -> float:
        return max(self.budget.ready_at(sender, "state"), self.budget.quiet_at(sender))

    def release(self) -> list[Incoming]:
        """Held messages whose sender's flood is over (each charged a token)."""
        now = self.clock()
        if not self.held or now < self.next_release:
            return []
        ready, self.next_release = [], math.inf
        for sender, message in list(self.held.items()):
            at = self._ready_at(sender)
            if at <= self.clock() and self.budget.admit(sender, "state"):
                del self.held[sender]
                ready.append(message)
            else:
                self.next_release = min(self.next_release, at)
        return ready

    def may_log(self, reason: str) -> bool:
        """Whether to write one rejection line (else it is only counted)."""
        if self.quiet:
            self.budget.held_back[reason] += 1
            return False
        return self.budget.may_log(reason)

    def throttled(self) -> tuple[str, ...]:
        """The client ids that went past a budget in this run (for the run state)."""
        return tuple(sorted((s for s in self.budget.named if "/" not in s), key=client_order))
