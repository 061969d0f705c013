"""The FEMNIST-style CNN of FedSAP (001_288956de9ced9de5.txt, Section 4.1): two
convolutional layers and two fully connected layers, for small images (8x8 digits,
28x28 MNIST). The first fully connected layer's output is the embedding."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from mqttfl.models.base import EmbeddingModel


class ImageCNN(EmbeddingModel):
    """conv5x5(32)-ReLU-pool, conv5x5(64)-ReLU-pool, fc(→embed_dim)-ReLU; fc classifier.

    Convs are padded and the feature map is pooled to 4x4, so 8x8 and 28x28 inputs
    give the same weight shapes.
    """

    arch = "cnn"

    def __init__(self, *, num_classes: int, embed_dim: int = 256) -> None:
        super().__init__(embed_dim=embed_dim, num_classes=num_classes)
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(4),
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, embed_dim), nn.ReLU(inplace=True))
        self.classifier = nn.Linear(embed_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(1)
        return cast("torch.Tensor", self.fc(self.features(x)))
