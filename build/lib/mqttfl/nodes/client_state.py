"""A client's state file: model, optimizer, method state and progress, for restarts."""

from __future__ import annotations

import asyncio
import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from mqttfl.algorithms.base import ClientSide


@dataclass
class Progress:
    """How far a client got: the rounds it trained and applied, its bytes sent per round."""

    trained_round: int = 0
    applied_round: int = 0
    bytes_up: dict[int, int] = field(default_factory=dict)


class StateFile:
    """Snapshots are taken between training steps and written in the background, one
    write at a time, so serializing the model is not on the round's critical path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writing: asyncio.Task[None] | None = None

    def load(self, model: torch.nn.Module, method: ClientSide, progress: Progress) -> bool:
        if not self.path.exists():
            return False
        self.restore(torch.load(self.path, weights_only=True), model, method, progress)
        return True

    @staticmethod
    def restore(
        state: dict[str, Any], model: torch.nn.Module, method: ClientSide, progress: Progress
    ) -> None:
        """Put back what :meth:`snapshot` took (or a state file held)."""
        model.load_state_dict(state["model"])
        method.optimizer.load_state_dict(state["optimizer"])
        method.load_state_dict({k: v.numpy() for k, v in state["method"].items()})
        progress.trained_round = int(state["trained_round"])
        progress.applied_round = int(state["applied_round"])

    @staticmethod
    def snapshot(model: torch.nn.Module, method: ClientSide, progress: Progress) -> dict[str, Any]:
        return {
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(method.optimizer.state_dict()),
            "method": {
                k: torch.from_numpy(np.array(v, copy=True)) for k, v in method.state_dict().items()
            },
            "trained_round": progress.trained_round,
            "applied_round": progress.applied_round,
        }

    def _write(self, snapshot: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        torch.save(snapshot, tmp)
        os.replace(tmp, self.path)

    async def save(self, model: torch.nn.Module, method: ClientSide, progress: Progress) -> None:
        """Snapshot now, write in the background (each write waits for the one before)."""
        snapshot = self.snapshot(model, method, progress)
        await self.written()
        self._writing = asyncio.create_task(asyncio.to_thread(self._write, snapshot))

    async def written(self) -> None:
        if self._writing is not None:
            await self._writing
            self._writing = None
