"""TinyConvNet4, MiddleConvNet4 and LargeConvNet4 (FedAPA, Table II).

Every block is a 3x3 convolution with stride 2, padding 1 and no bias (BatchNorm
follows, so a bias would be redundant), then BatchNorm2d and ReLU.  An adaptive
average pool makes the encoder accept any (T, S) window, which matters because
devices report different subcarrier counts.  Middle and Large end the encoder in a
1x1 convolution head (with bias) that lifts the pooled channels to ``embed_dim``.

With ``num_classes=20`` and ``embed_dim=256`` the parameter counts are exactly the
paper's 7.96 K / 18.44 K / 463.75 K (7,956 / 18,436 / 463,748).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mqttfl.models.base import EmbeddingModel, EncoderStages


def _conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


class ConvNet4(EmbeddingModel):
    """Stack of stride-2 conv blocks, global average pool, optional 1x1 head.

    ``channels`` lists the output channels of each block.  With ``head=False`` the
    last block must already produce ``embed_dim`` channels (the Tiny variant).
    """

    sample_ndim = 2

    def __init__(
        self,
        channels: Sequence[int],
        *,
        num_classes: int,
        embed_dim: int = 256,
        head: bool = True,
    ) -> None:
        super().__init__(embed_dim=embed_dim, num_classes=num_classes)
        if not channels:
            raise ValueError("channels must not be empty")
        if not head and channels[-1] != embed_dim:
            raise ValueError("without a head the last block must output embed_dim channels")
        layers: list[nn.Module] = []
        c_in = 1
        for c_out in channels:
            layers += _conv_block(c_in, c_out)
            c_in = c_out
        layers.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers)
        self.head = nn.Conv2d(c_in, embed_dim, kernel_size=1, stride=1, bias=True) if head else None
        self.classifier = nn.Linear(embed_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder f(h; w^e): (B, T, S) or (B, 1, T, S) amplitude -> (B, embed_dim)."""
        return self._finish(self.features(self._prepare(x)))

    def encoder_stages(self) -> EncoderStages:
        return EncoderStages(self._prepare, self.features, self._finish)

    @staticmethod
    def _prepare(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.unsqueeze(1)  # CSI windows arrive without the channel dim
        if x.dim() != 4 or x.shape[1] != 1:
            raise ValueError(f"expected input (B, T, S) or (B, 1, T, S), got {tuple(x.shape)}")
        return x

    def _finish(self, pooled: torch.Tensor) -> torch.Tensor:
        z = pooled if self.head is None else self.head(pooled)
        return torch.flatten(z, 1)


class TinyConvNet4(ConvNet4):
    """One block 1 -> embed_dim, no head (Table II, left column)."""

    arch = "tiny"

    def __init__(self, *, num_classes: int, embed_dim: int = 256) -> None:
        super().__init__((embed_dim,), num_classes=num_classes, embed_dim=embed_dim, head=False)


class MiddleConvNet4(ConvNet4):
    """Blocks 1 -> 16 -> 32, then a 1x1 head 32 -> embed_dim (Table II, middle)."""

    arch = "middle"

    def __init__(self, *, num_classes: int, embed_dim: int = 256) -> None:
        super().__init__((16, 32), num_classes=num_classes, embed_dim=embed_dim)


class LargeConvNet4(ConvNet4):
    """Blocks 1 -> 16 -> 32 -> 64 -> 128 -> 256, 1x1 head 256 -> embed_dim (Table II)."""

    arch = "large"

    def __init__(self, *, num_classes: int, embed_dim: int = 256) -> None:
        super().__init__((16, 32, 64, 128, 256), num_classes=num_classes, embed_dim=embed_dim)
