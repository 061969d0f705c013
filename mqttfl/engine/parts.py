"""Each client's part in a run, as the round engine counts it (:mod:`mqttfl.engine.roster`)
and the checkpoint keeps it (:class:`mqttfl.engine.documents.ClientPart`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Part:
    """A client's part in the run so far."""

    selected: int = 0  # rounds it was selected for (a retry counts once)
    uploaded: int = 0  # rounds whose aggregate took its upload
    missed: int = 0  # rounds it was selected for and whose aggregate lacks it
    left: list[int] = field(default_factory=list)  # the rounds in which it left
    rejoined: list[int] = field(default_factory=list)  # ...and came back

    def to_map(self) -> dict[str, Any]:
        return {
            "selected": self.selected,
            "uploaded": self.uploaded,
            "missed": self.missed,
            "left": list(self.left),
            "rejoined": list(self.rejoined),
        }
