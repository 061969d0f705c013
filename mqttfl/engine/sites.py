"""What the coordinator makes of a site bridge's notices (``mqttfl/<run>/site/<site>``).

Mosquitto's bridge publishes ``1`` when it connects and leaves ``0`` as its last will, so
``0`` means every client behind that site is gone at once. Only a change counts: a site
already down that is said to be down again changes nothing, and a notice that repeats is
counted, not logged. A site may take its clients offline at most once every
:data:`SITE_HOLD_S` seconds: on an open broker anyone can publish a notice, and a forged
``0`` ten times a second would keep a client out of every round. A client taken
offline by its site is back as soon as it sends anything (its metrics after the next
round), as after a real outage.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

SITE_HOLD_S = 30.0
MAX_SITES = 1024  # sites remembered; a notice of one more site is counted and ignored


@dataclass
class SiteNotices:
    up: dict[str, bool] = field(default_factory=dict)
    dropped_at: dict[str, float] = field(default_factory=dict)  # when a site last took clients
    held_for: dict[str, float] = field(default_factory=dict)  # the drop a "held" was told for
    repeats: Counter[str] = field(default_factory=Counter)  # notices that changed nothing

    def change(self, site: str, up: bool, now: float) -> str | None:
        """What a notice does: ``"up"``, ``"down"`` (take the site's clients offline),
        ``"held"`` (a drop too soon after the site's last one: told once per drop), or
        None (nothing to tell)."""
        if site not in self.up and len(self.up) >= MAX_SITES:
            self.repeats["(too many sites)"] += 1
            return None
        before = self.up.get(site)
        if before is up:
            self.repeats[site] += 1
            return None
        self.up[site] = up
        last = self.dropped_at.get(site, -math.inf)
        if up:  # back from a drop that was held: nothing happened to tell
            quiet = before is False and self.held_for.get(site) == last
            self.repeats[site] += quiet
            return None if quiet else "up"
        if now - last < SITE_HOLD_S:
            told = self.held_for.get(site) == last
            self.held_for[site] = last
            self.repeats[site] += told
            return None if told else "held"
        self.dropped_at[site] = now
        return "down"
