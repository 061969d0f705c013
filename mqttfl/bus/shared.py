"""One copy of a large payload per process, however many sessions receive it.

A fleet's runners are devices of their own to the broker, each with its own session, so
a round's broadcast reaches the process once per runner. Every session's copy is
compared with the newest large payload seen on its topic and, when equal, dropped for
it: the runners' queues and decoded messages then share one object (a comparison of
bytes, far cheaper than holding or decoding them again).
"""

from __future__ import annotations

from collections import OrderedDict

SHARED_MIN_BYTES = 64 * 1024  # below this a copy costs less than the comparison's bookkeeping
TOPICS_KEPT = 2  # the newest broadcast and the one before it (retained, fetched late)


class SharedPayloads:
    def __init__(self, *, min_bytes: int = SHARED_MIN_BYTES, kept: int = TOPICS_KEPT) -> None:
        self.min_bytes = min_bytes
        self.kept = kept
        self.newest: OrderedDict[str, bytes] = OrderedDict()

    def share(self, topic: str, payload: bytes) -> bytes:
        """``payload``, or the equal one this process already holds for ``topic``."""
        if len(payload) < self.min_bytes:
            return payload
        held = self.newest.get(topic)
        if held is not None and held == payload:
            return held
        self.newest[topic] = payload
        self.newest.move_to_end(topic)
        while len(self.newest) > self.kept:
            self.newest.popitem(last=False)
        return payload


#: this process's: every bus shares through it
PROCESS_PAYLOADS = SharedPayloads()
