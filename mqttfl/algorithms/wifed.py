"""WiFederated (Hernandez & Bulut, IEEE IoT-J 2021), the FedAPA paper's "WiFed" baseline.

The shared model is trained with FedAvg (sample-weighted, within architecture groups,
the same upload as :mod:`mqttfl.algorithms.fedavg`). Before a client evaluates, it
fine-tunes a copy of the new global model on its local training data for
``finetune_epochs`` epochs and predicts with that copy; the next round's local training
starts again from the global model, so fine-tuning never leaks into the average.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import Algorithm
from mqttfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mqttfl.training.lazy import F
from mqttfl.training.loops import make_optimizer, predict_logits, train_epochs
from mqttfl.wire.ids import client_number
from mqttfl.wire.schemas import Body

if TYPE_CHECKING:
    import torch

    from mqttfl.models import EmbeddingModel


class WiFedParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    finetune_epochs: int = Field(3, ge=0)


class WiFedClient(FedAvgClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received_round = 0
        self.personal: EmbeddingModel | None = None  # the fine-tuned copy used to predict
        self.personal_round = -1

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        super().receive(t, broadcast, personal)
        self.received_round = t  # fine-tuning waits for predict(), which runs off the event loop

    def finetune(self, t: int) -> EmbeddingModel:
        """A copy of the (global) model after ``finetune_epochs`` local epochs of CE."""
        tuned = copy.deepcopy(self.model)
        epochs = self.ctx.params.finetune_epochs
        if epochs:
            key = client_number(self.info.client_id)
            rng = np.random.default_rng([self.ctx.seed, t, key, 1])
            train_epochs(
                tuned,
                make_optimizer(tuned, self.train_config),
                self.shard.x_train,
                self.shard.y_train,
                lambda logits, z, y: F.cross_entropy(logits, y),
                epochs=epochs,
                batch_size=self.train_config.batch_size,
                rng=rng,
            )
        return tuned

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """The copy fine-tuned from round ``t``'s global model, as :meth:`predict` uses it."""
        from mqttfl.models.scoring import Logits

        if self.personal is None or self.personal_round != t:
            self.personal, self.personal_round = self.finetune(t), t
        return Logits(self.personal)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predictions of the copy fine-tuned from the latest global model."""
        if self.personal is None or self.personal_round != self.received_round:
            self.personal = self.finetune(self.received_round)
            self.personal_round = self.received_round
        return cast("np.ndarray", predict_logits(self.personal, x).argmax(axis=1))


ALGORITHMS = (
    Algorithm(
        "wifed",
        FedAvgServer,
        WiFedClient,
        WiFedParams,
        summary="FedAvg, then local fine-tuning before evaluation (WiFederated)",
    ),
)
