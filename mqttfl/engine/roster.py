"""The clients the round engine knows: who is live, who may be selected, who has spent
its [privacy] budget, and each one's part in the run (the rounds it was selected for,
uploaded in and missed; the rounds in which it left and came back), which the checkpoint
keeps and the summary reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqttfl.engine.parts import Part
from mqttfl.wire.ids import client_order

if TYPE_CHECKING:
    from mqttfl.config import FederationConfig
    from mqttfl.engine.actions import ClientRecord
    from mqttfl.engine.gate import UploadGate
    from mqttfl.engine.state import RunState


class Roster:
    """What :class:`~mqttfl.engine.rounds.RoundEngine` knows of its clients (a base of it)."""

    clients: dict[str, ClientRecord]
    fed: FederationConfig
    state: RunState
    gate: UploadGate
    round: int

    def live(self) -> list[str]:
        return sorted((c for c, r in self.clients.items() if r.online), key=client_order)

    def missing(self) -> list[str] | int:
        """The expected clients not live: their ids where the ids are 0..N-1 (as `broker
        init --clients N` makes them), else how many."""
        live = self.live()
        expected = [str(i) for i in range(self.fed.num_clients)]
        if set(live) <= set(expected):
            return [c for c in expected if c not in live]
        return max(self.fed.num_clients - len(live), 0)

    def selectable(self) -> list[str]:
        return [c for c in self.live() if self.clients[c].responsive and not self.spent(c)]

    def spent(self, client: str) -> bool:
        """[privacy]: ``client`` can upload no more, by our count or by its own word."""
        record = self.clients.get(client)
        return (record is not None and record.budget_spent) or self.gate.over_budget(client)

    def budgets_left(self) -> int:
        """Clients that may still upload (expected ones not heard of yet count)."""
        known = set(self.clients) | set(self.state.clients)
        unheard = max(self.fed.num_clients - len(known), 0)
        return len([c for c in known if not self.spent(c)]) + unheard

    # --- each client's part ----------------------------------------------------------------
    def part(self, client: str) -> Part:
        return self.state.parts.setdefault(client, Part())

    def went(self, client: str) -> None:
        """``client`` left while round ``self.round`` was open or next."""
        part = self.part(client)
        if len(part.left) <= len(part.rejoined):
            part.left.append(self.round)

    def came_back(self, client: str) -> None:
        part = self.part(client)
        if len(part.left) > len(part.rejoined):
            part.rejoined.append(self.round)

    def count_round(self, selected: frozenset[str] | list[str], uploaded: set[str]) -> None:
        """Round ``self.round`` closed: who was selected, and whose upload it took."""
        for client in selected:
            part = self.part(client)
            part.selected += 1
            if client in uploaded:
                part.uploaded += 1
            else:
                part.missed += 1
