"""Evaluation modules: one ``x -> class scores`` module per way a method predicts.

A client's evaluation model (:meth:`mqttfl.algorithms.base.ClientSide.evaluation_model`)
is one of these, so that ``mqttfl export`` can trace it to ONNX as a single graph whose
argmax is the class the client's ``predict`` returns.
"""

from __future__ import annotations

import torch
from torch import nn

from mqttfl.models.base import EmbeddingModel

#: the score given to a class the prototype bank does not hold (never the argmax)
UNAVAILABLE_SCORE = -1e9


class Logits(nn.Module):
    """The classifier head's logits g(f(x)): the default evaluation model."""

    def __init__(self, model: EmbeddingModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(x)[0]
        return logits


class NearestPrototype(nn.Module):
    """FedProto inference as scores: -‖r(h) - p̄_c‖₂ for the classes in the bank, a large
    negative constant for the others, so the argmax is the nearest available prototype."""

    def __init__(self, model: EmbeddingModel, bank: torch.Tensor, available: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("bank", bank.detach().clone().float())
        self.register_buffer("missing", (~available.bool()).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.model.embed(x)
        bank: torch.Tensor = self.bank  # type: ignore[assignment]
        missing: torch.Tensor = self.missing  # type: ignore[assignment]
        squared = (z.unsqueeze(1) - bank.unsqueeze(0)).pow(2).sum(dim=2)
        scores = -torch.sqrt(squared)
        return torch.where(missing.unsqueeze(0), torch.full_like(scores, UNAVAILABLE_SCORE), scores)


class AdjustedHead(nn.Module):
    """FedPAM's adjusted head: W·P_k·z + b (Eq. 3.1)."""

    def __init__(self, model: EmbeddingModel, pam: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        weight = model.classifier.weight.detach() @ pam.detach()
        self.register_buffer("weight", weight.clone())
        self.register_buffer("bias", model.classifier.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight: torch.Tensor = self.weight  # type: ignore[assignment]
        bias: torch.Tensor = self.bias  # type: ignore[assignment]
        return self.model.embed(x) @ weight.T + bias
