"""A budget per sender: every message from one identity costs bounded work and memory.

The coordinator keeps a token bucket per sender (the client id in the topic; a site's
bridge, the lease topic, or one shared key for topics that name nobody) and per kind of
message:

- ``state``: what replaces an earlier message of its sender (a client's status, a site
  notice). One per connection is normal. Beyond the budget the newest one of each sender
  is held until the sender has been within its budget for :data:`QUIET_S` seconds, and
  the ones it replaced are never read: a flood of them costs one held message per
  sender, does not flip a device on and off while it trains, and its last word is still
  heard.
- ``work``: messages that must be decoded (an acknowledgement, metrics, an upload the
  open round waits for). Beyond the budget they are dropped and counted (``throttled``).
- ``noise``: messages dropped in O(1) from their topic alone (an upload for a past or
  future round, a repeated one). They cost no decoding and are always counted with their
  reason, but a sender past this budget is no longer logged message by message.

A sender that runs out of any budget is named once (``client.throttled``). Rejection
lines from all senders together have one more budget (:data:`LOG`); what it holds back
is counted and summed up in one line at most every :data:`SUMMARY_S` seconds.

Buckets exist for at most ``max_senders`` senders (the least recently heard one is
forgotten, and starts again with a full bucket), so an open broker's endless invented ids
cost bounded memory. Pure and clock-injected, like the rest of the engine.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["state", "work", "noise"]


@dataclass(frozen=True)
class Rate:
    """``per_s`` tokens a second, at most ``burst`` saved up."""

    per_s: float
    burst: float


# A device sends a status per connection and about three messages per round (an
# acknowledgement, an upload, metrics; up to 20 resends of an upload that went wrong).
RATES: dict[Kind, Rate] = {
    "state": Rate(2.0, 20.0),
    "work": Rate(20.0, 100.0),
    "noise": Rate(5.0, 50.0),
}
LOG = Rate(20.0, 100.0)  # rejection lines a second, all senders together
SUMMARY_S = 30.0  # at most one line a period sums up what was held back
QUIET_S = 2.0  # a flood of state messages is over when its sender has kept this quiet
MAX_SENDERS = 4096
MAX_NAMED = 1000  # senders named in the run state; more are counted only
UNNAMED = "/topic"  # one shared key for topics that name no sender (never a client id)


class Buckets:
    """Token buckets keyed by sender, at most ``max_keys`` of them."""

    def __init__(self, rate: Rate, clock: Callable[[], float], max_keys: int) -> None:
        self.rate, self.clock, self.max_keys = rate, clock, max_keys
        self._level: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def _tokens(self, key: str, now: float) -> float:
        found = self._level.get(key)
        if found is None:
            return self.rate.burst
        tokens, then = found
        return min(self.rate.burst, tokens + (now - then) * self.rate.per_s)

    def take(self, key: str) -> bool:
        """Spend one token of ``key``'s bucket; False (nothing spent) when it is empty."""
        now = self.clock()
        tokens = self._tokens(key, now)
        taken = tokens >= 1.0
        self._level[key] = (tokens - 1.0 if taken else tokens, now)
        self._level.move_to_end(key)
        if len(self._level) > self.max_keys:
            self._level.popitem(last=False)
        return taken

    def ready_at(self, key: str) -> float:
        """When ``key``'s bucket holds a token again."""
        now = self.clock()
        missing = 1.0 - self._tokens(key, now)
        if missing <= 0:
            return now
        return now + missing / self.rate.per_s if self.rate.per_s > 0 else math.inf


class SenderBudget:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        rates: dict[Kind, Rate] | None = None,
        log: Rate = LOG,
        max_senders: int = MAX_SENDERS,
    ) -> None:
        self.clock = clock
        rates = rates or RATES
        self.buckets = {kind: Buckets(rate, clock, max_senders) for kind, rate in rates.items()}
        self.lines = Buckets(log, clock, 1)
        self.named: dict[str, Kind] = {}  # sender -> the budget it first ran out of
        self.last_over: OrderedDict[str, float] = OrderedDict()  # when it last went past
        self.max_senders = max_senders
        self.over: Counter[Kind] = Counter()  # messages past a budget, by kind
        self.held_back: Counter[str] = Counter()  # rejection lines not written, by reason
        self._fresh: list[str] = []
        self._summed_at = clock()

    def admit(self, sender: str, kind: Kind) -> bool:
        """Whether ``sender`` may have one more message of ``kind`` handled (or logged)."""
        if self.buckets[kind].take(sender):
            return True
        self.over[kind] += 1
        self.last_over[sender] = self.clock()
        self.last_over.move_to_end(sender)
        if len(self.last_over) > self.max_senders:
            self.last_over.popitem(last=False)
        if sender not in self.named and len(self.named) < MAX_NAMED:
            self.named[sender] = kind
            self._fresh.append(sender)
        return False

    def ready_at(self, sender: str, kind: Kind) -> float:
        return self.buckets[kind].ready_at(sender)

    def quiet_at(self, sender: str) -> float:
        """When ``sender`` will have kept within its budgets for :data:`QUIET_S`."""
        return self.last_over.get(sender, -math.inf) + QUIET_S

    def newly_named(self) -> list[str]:
        """Senders that ran out of a budget since the last call (each comes once)."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def may_log(self, reason: str) -> bool:
        """One rejection line, within the budget of lines; else counted as held back."""
        if self.lines.take(""):
            return True
        self.held_back[reason] += 1
        return False

    def summary_due(self) -> dict[str, int] | None:
        """What was held back since the last summary, once :data:`SUMMARY_S` has passed."""
        now = self.clock()
        if not self.held_back or now - self._summed_at < SUMMARY_S:
            return None
        held, self.held_back = dict(self.held_back), Counter()
        self._summed_at = now
        return held
