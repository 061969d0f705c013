"""The encoder/classifier split every mqttfl model follows.

FedAPA (Sec. III-B) writes a client model ``w_i`` as an encoder ``w_i^e`` and a
classifier ``w_i^c``: the embedding is ``r(h) = f(h; w^e)`` and the prediction is
``g(r(h); w^c)``.  Prototype methods (Eq. 4) average ``r(h)`` per class, so every
model must expose the embedding separately from the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn


@dataclass(frozen=True)
class EncoderStages:
    """An encoder written as ``finish(body(prepare(x)))``, where the Sequential ``body``
    holds every BatchNorm layer: what lets AdaBN go on from one layer's input to the next
    instead of starting again from the windows (:mod:`mqttfl.training.normstats`)."""

    prepare: Callable[[torch.Tensor], torch.Tensor]
    body: nn.Sequential
    finish: Callable[[torch.Tensor], torch.Tensor]


class EmbeddingModel(nn.Module):
    """Base class: ``embed`` is f(h; w^e), ``classify`` is g(z; w^c).

    Subclasses build their encoder first and then assign ``self.classifier``
    (a ``Linear(embed_dim, num_classes)``), so in every ``state_dict`` the classifier
    weights live under the ``classifier.`` prefix and the encoder under the rest.
    """

    #: registry name, set by each subclass
    arch: str = "base"
    #: number of dims of one sample (2 for (T, S) windows, 1 for feature vectors)
    sample_ndim: int = 2
    classifier: nn.Linear

    def __init__(self, *, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        if embed_dim < 1:
            raise ValueError(f"embed_dim must be >= 1, got {embed_dim}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.embed_dim = int(embed_dim)
        self.num_classes = int(num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of samples to embeddings of shape (B, embed_dim)."""
        raise NotImplementedError

    def encoder_stages(self) -> EncoderStages | None:
        """The encoder in stages (:class:`EncoderStages`); None where it is not written so."""
        return None

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Map embeddings (B, embed_dim) to logits (B, num_classes)."""
        return cast("torch.Tensor", self.classifier(z))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(logits, embedding)`` so losses on both need one pass."""
        z = self.embed(x)
        return self.classify(z), z
