"""What `mqttfl watch` shows of a buffered run (``federation.mode = "buffered"``,
:mod:`mqttfl.engine.buffered`): versions published, the buffer's fill since the last
one, and each client's staleness, all read from the upload topics.

An upload on round u's topic while round t is open (or t-1 has closed and t is not yet
announced) is t - u versions stale. The fill counts the uploads seen since the newest
version closed; it is what the watcher saw, so it may count an upload the coordinator
refuses (a too-stale one: its τ is shown all the same).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mqttfl.config import RunConfig
from mqttfl.engine.documents import BufferedBlock

MAX_SHOWN = 6  # staleness values listed in the header before "..."


@dataclass
class BufferWatch:
    buffer_size: int
    max_staleness: int
    fill: int = 0
    version: int = 0  # the newest version closed when the fill was counted
    staleness: dict[str, int] = field(default_factory=dict)  # client -> τ of its newest upload
    seen: Counter[int] = field(default_factory=Counter)  # τ -> uploads
    counted: set[tuple[int, str]] = field(default_factory=set)  # (round, client), recent

    def upload(self, client: str, t: int, current: int, closed: int) -> int | None:
        """Count an upload of round ``t`` seen while ``current`` is the open (or next)
        round and ``closed`` the newest closed one; return its staleness (None: a repeat,
        or a round not yet announced)."""
        if t > current or (t, client) in self.counted:
            return None
        if current - t > self.max_staleness:  # the coordinator refuses it: not kept here
            self.seen[current - t] += 1
            return current - t
        if closed != self.version:
            self.version, self.fill = closed, 0
            low = current - self.max_staleness - 1  # older ones are refused: forget them
            self.counted = {k for k in self.counted if k[0] >= low}
        self.counted.add((t, client))
        tau = current - t
        self.fill += 1
        self.staleness[client] = tau
        self.seen[tau] += 1
        return tau

    def line(self, closed: int) -> str:
        fill = self.fill if closed == self.version else 0
        taus = sorted(self.seen.items())
        shown = " ".join(f"{tau}:{n}" for tau, n in taus[:MAX_SHOWN])
        more = " ..." if len(taus) > MAX_SHOWN else ""
        return (
            f"versions {closed} · buffer {fill}/{self.buffer_size} · staleness (τ:uploads, "
            f"max {self.max_staleness}) {shown or '-'}{more}"
        )

    def cell(self, client: str) -> str:
        tau = self.staleness.get(client)
        return "-" if tau is None else str(tau)


def buffer_watch(config: RunConfig) -> BufferWatch | None:
    """The buffered run's part of the view, or None for synchronous rounds."""
    fed = config.federation
    return BufferWatch(fed.buffer_size, fed.max_staleness) if fed.mode == "buffered" else None


def buffered_note(block: BufferedBlock) -> str:
    """The final table's line about a buffered run (``summary.buffered``)."""
    seen = {int(k): n for k, n in block.staleness.items()}
    total = sum(seen.values())
    shown = ", ".join(f"τ={tau}: {n}" for tau, n in sorted(seen.items())) or "none"
    mean = sum(tau * n for tau, n in seen.items()) / total if total else 0.0
    return (
        f"buffered: {block.versions} versions of {block.buffer_size} uploads "
        f"(max staleness {block.max_staleness}, s(τ) {block.staleness_weighting}); "
        f"aggregated uploads by staleness {shown} (mean τ {mean:.2f}); "
        f"{block.too_stale} refused as too stale"
    )
