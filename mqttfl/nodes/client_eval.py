"""A client's per-round evaluation of a downlink, and when it runs.

Each round's downlink is scored on the client's test split (the per-round personalized
metrics). When the next round's training follows at once (synchronous rounds, not the
last one), the evaluation waits until that training's upload is sent: the model the
downlink left, and the method's state, are kept aside and put back for the scoring,
then the trained ones are restored. The round's critical path is then training alone;
the scoring fills the time a client would otherwise wait for the slowest one and the
coordinator. What the metrics carry about the round itself (bytes, whether the client
trained, its training loss) is taken when the downlink is applied.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttfl.training.metrics import classification_report

if TYPE_CHECKING:
    import torch

    from mqttfl.algorithms.base import ClientSide
    from mqttfl.data.shard import Shard

#: runs a blocking call off the event loop (the runner's training thread)
OffLoop = Callable[..., Awaitable[Any]]


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    return {k: np.array(v, copy=True) for k, v in state.items()}


@dataclass
class Evaluation:
    """Round ``round``'s scoring, with what its metrics say of the round besides scores."""

    round: int
    values: dict[str, Any]
    kept: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = field(default=None, repr=False)

    def keep(self, model: torch.nn.Module, method: ClientSide) -> None:
        """Keep the model and method state the downlink left, to score them later."""
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.kept = (weights, _copied(method.state_dict()))

    async def scores(
        self, model: torch.nn.Module, method: ClientSide, shard: Shard, off_loop: OffLoop
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(accuracy/F1/MAE, the method's extra metrics) on ``shard``'s test split, of the
        kept state if there is one (the current state is put back afterwards)."""
        current = None
        if self.kept is not None:
            current = (
                {k: v.detach().clone() for k, v in model.state_dict().items()},
                _copied(method.state_dict()),
            )
            model.load_state_dict(self.kept[0])
            method.load_state_dict(self.kept[1])
        try:
            predicted = await off_loop(method.predict, shard.x_test)
            report = classification_report(shard.y_test, predicted)
            extra = await off_loop(method.extra_metrics, shard.x_test, shard.y_test)
        finally:
            if current is not None:
                model.load_state_dict(current[0])
                method.load_state_dict(current[1])
        return report, extra
