"""FedProto (Tan et al., AAAI 2022): federated prototype learning.

Clients share class prototypes only, so they may run different architectures (all
embed into ``model.embed_dim``). Server: the class-wise mean of the uploaded prototypes
over the clients holding each class (``proto_weighting="samples"`` weights it by the
clients' per-class sample counts instead, as in the paper's Eq. 6; only then do the
clients upload those counts). Client: cross-entropy
plus λ·MSE between each embedding and its class's global prototype; it predicts with its
classifier head or by the nearest global prototype (``inference``), and reports both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import Algorithm, Context
from mqttfl.algorithms.common.prototypes import (
    BankServer,
    Inference,
    PrototypeClient,
    prototype_mse,
)
from mqttfl.training.lazy import F
from mqttfl.wire.control import Number

if TYPE_CHECKING:
    from torch import Tensor


class FedProtoParams(BaseModel):
    """λ=1 (the value FedProto and FedAli's tuning both settle on)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    proto_lambda: float = Field(1.0, ge=0)
    proto_weighting: Literal["mean", "samples"] = "mean"
    inference: Inference = "head"


class FedProtoServer(BankServer):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.count_weighted = ctx.params.proto_weighting == "samples"


class FedProtoClient(PrototypeClient):
    @classmethod
    def uploads_counts(cls, ctx: Context) -> bool:
        """Only the sample-weighted bank (``proto_weighting="samples"``) reads counts."""
        return bool(ctx.params.proto_weighting == "samples")

    def loss(
        self, t: int, params: Mapping[str, Number], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        """L = CE(g(r(h)), y) + λ·MSE(r(h), p̄_y)."""
        loss = F.cross_entropy(logits, y)
        lam = self.ctx.params.proto_lambda
        if lam <= 0 or not self.has_bank():
            return loss
        assert self.bank is not None
        assert self.available is not None
        return cast("Tensor", loss + lam * prototype_mse(embedding, self.bank, y, self.available))


ALGORITHMS = (
    Algorithm(
        "fedproto",
        FedProtoServer,
        FedProtoClient,
        FedProtoParams,
        summary="global class-mean prototypes, CE + λ·MSE (FedProto)",
    ),
)
