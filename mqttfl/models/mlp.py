"""A small MLP for samples that are 1-D feature vectors rather than CSI windows.

Not part of FedAPA; it lets the same encoder/classifier contract (Sec. III-B)
serve pre-extracted features, e.g. per-subcarrier statistics.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from mqttfl.models.base import EmbeddingModel


class FeatureMLP(EmbeddingModel):
    """Encoder Linear(input_dim, hidden) - ReLU - Linear(hidden, embed_dim); linear classifier."""

    arch = "mlp"
    sample_ndim = 1

    def __init__(
        self, *, input_dim: int, num_classes: int, embed_dim: int = 256, hidden: int = 128
    ) -> None:
        super().__init__(embed_dim=embed_dim, num_classes=num_classes)
        if input_dim < 1:
            raise ValueError(f"input_dim must be >= 1, got {input_dim}")
        self.input_dim = int(input_dim)
        self.encoder = nn.Sequential(
            nn.Linear(input_dim, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, embed_dim),
        )
        self.classifier = nn.Linear(embed_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder f(h; w^e): (B, input_dim) -> (B, embed_dim); extra dims are flattened."""
        if x.dim() != 2:
            x = torch.flatten(x, 1)  # tolerate (B, T, S) by treating it as T*S features
        if x.shape[1] != self.input_dim:
            raise ValueError(f"expected {self.input_dim} features, got {x.shape[1]}")
        return cast("torch.Tensor", self.encoder(x))
