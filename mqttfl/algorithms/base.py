"""The algorithm seam: a method is a server side, a client side and its permitted payload.

The runtime owns the round loop and the transport; a method only says what to send
down, how to aggregate what came up, which local loss to train with, and exactly which
fields a client may upload (:meth:`Algorithm.upload_schema`). Methods import torch,
numpy and the wire's schema types, never the runtime.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from mqttfl.training.loops import make_optimizer, predict_logits, train_epochs
from mqttfl.wire.schemas import ClientInfo, PayloadSchema

if TYPE_CHECKING:
    from mqttfl.config import TrainConfig
    from mqttfl.data.shard import Shard
    from mqttfl.models import EmbeddingModel


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Context:
    """Run-wide facts both sides agree on."""

    num_classes: int
    embed_dim: int
    rounds: int
    seed: int
    params: Any  # the method's validated parameter model


@dataclass(frozen=True)
class Upload:
    client_id: str
    info: ClientInfo
    body: dict[str, Any]  # already validated against the method's upload schema


@dataclass
class Downlinks:
    broadcast: dict[str, Any] = field(default_factory=dict)
    personal: dict[str, dict[str, Any]] = field(default_factory=dict)


class ServerSide(ABC):
    """Server half of a method: round parameters and aggregation."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def round_params(self, t: int) -> dict[str, Any]:
        """Published in the round's start message (schedules live on the server)."""
        return {}

    @abstractmethod
    def aggregate(self, t: int, uploads: list[Upload]) -> Downlinks: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class ClientSide(ABC):
    """Client half of a method: local objective, upload, use of downlinks.

    The default :meth:`train` runs SGD over the shard with :meth:`loss`; methods with a
    different local procedure override it.
    """

    def __init__(
        self,
        ctx: Context,
        info: ClientInfo,
        model: EmbeddingModel,
        shard: Shard,
        train: TrainConfig,
    ) -> None:
        self.ctx = ctx
        self.info = info
        self.model = model
        self.shard = shard
        self.train_config = train
        self.optimizer = make_optimizer(model, train)

    # --- training -------------------------------------------------------------
    def loss(
        self, t: int, params: dict[str, Any], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        return torch.nn.functional.cross_entropy(logits, y)

    def train(self, t: int, params: dict[str, Any], rng: np.random.Generator) -> float:
        return train_epochs(
            self.model,
            self.optimizer,
            self.shard.x_train,
            self.shard.y_train,
            lambda logits, z, y: self.loss(t, params, logits, z, y),
            epochs=self.train_config.local_epochs,
            batch_size=self.train_config.batch_size,
            rng=rng,
        )

    @classmethod
    @abstractmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        """Exactly what this method's clients may upload; checked at both ends."""

    @abstractmethod
    def make_upload(self, t: int) -> dict[str, Any]:
        """The body to publish; it must validate against the method's upload schema."""

    def receive(self, t: int, broadcast: dict[str, Any], personal: dict[str, Any] | None) -> None:
        """Take in round t's downlinks (kept for the next round's training)."""
        return None

    # --- evaluation -------------------------------------------------------------
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class predictions of the personalized model (classifier head by default)."""
        return predict_logits(self.model, x).argmax(axis=1)

    def extra_metrics(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Further metrics published beside accuracy/F1/MAE (e.g. a second inference)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class Algorithm:
    """A registered method."""

    name: str
    server: type[ServerSide]
    client: type[ClientSide]
    params: type[BaseModel] = NoParams
    summary: str = ""

    def upload_schema(self, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return self.client.upload_schema(ctx, info)
