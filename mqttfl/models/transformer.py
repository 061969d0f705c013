"""A small pre-norm transformer encoder with ALP hooks (FedAli's HART-style backbone).

A (B, T, S) CSI window is read as a sequence of T tokens: each time step's S
subcarrier amplitudes are average-pooled to ``features`` values (so any S works with
the same weights) and projected linearly to ``width``; sinusoidal positions are added.
Windows longer than ``max_tokens`` are average-pooled along time first, to keep
attention affordable on a CPU. Each block is LN → ALP → self-attention (+ residual),
LN → MLP (+ residual), the ALP after the first norm as in FedAli (Fig. 2). A final LN,
a mean over tokens and a linear map to ``embed_dim`` give the embedding.

An :class:`ALPLayer` is the identity until a method attaches prototypes to it
(:meth:`ALPLayer.attach`), so other methods can train this model as a plain encoder.
Its prototypes are non-persistent buffers: they are not in ``state_dict`` and hence
never in the weight vector of :mod:`mqttfl.algorithms.common.weights`.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mqttfl.models.base import EmbeddingModel


def sinkhorn(scores: Tensor, *, epsilon: float, iterations: int) -> Tensor:
    """FedAli Eq. 3: O_0 = exp(scores/ε), then alternating Sinkhorn-Knopp normalizations.

    ``scores`` is (N, K) (embeddings × prototypes). Each iteration scales the prototypes'
    totals to 1/K, then the embeddings' totals to 1/N; the result is multiplied by N, so
    every row (embedding) sums to 1 and every column (prototype) approaches N/K.
    """
    n, k = scores.shape
    q = torch.exp((scores - scores.max()) / epsilon).T  # (K, N); the shift cancels out
    q = q / q.sum()
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / n
    return (q * n).T


def ema_update(prototypes: Tensor, x: Tensor, plan: Tensor, gamma: float) -> Tensor:
    """FedAli Eq. 5: P ← γ·P + (1-γ)·x̄, done in place and returned.

    For each prototype g, x̄_g is the average of its k = ⌈N/G⌉ embeddings with the
    highest transport score (the transposed plan), weighted by those scores normalized
    to sum to 1. ``plan`` is (N, G) over these prototypes.
    """
    groups = prototypes.shape[0]
    k = min(math.ceil(x.shape[0] / groups), x.shape[0])
    scores, index = plan.T.topk(k, dim=1)  # (G, k)
    weights = scores / scores.sum(dim=1, keepdim=True).clamp_min(1e-30)
    target = (weights.unsqueeze(-1) * x[index]).sum(dim=1)
    return prototypes.mul_(gamma).add_((1.0 - gamma) * target)


class ALPLayer(nn.Module):
    """Alignment with Prototypes (FedAli Algorithm 1) over (B, Z, d) token embeddings."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.glu = nn.Linear(dim, 2 * dim)  # GLU(p) = a ⊙ σ(b), [a, b] = Linear(p)
        self.register_buffer("local", torch.zeros(0, dim), persistent=False)
        self.register_buffer("shared", torch.zeros(0, dim), persistent=False)  # global prototypes
        self.beta = 0.2
        self.gamma = 0.999
        self.epsilon = 0.05
        self.iterations = 3

    def attach(
        self,
        local: Tensor,
        shared: Tensor,
        *,
        beta: float,
        gamma: float,
        epsilon: float,
        iterations: int,
    ) -> None:
        if local.shape[1] != self.dim or shared.shape[1] != self.dim:
            raise ValueError(f"prototypes must have width {self.dim}")
        self.local = local.detach().clone().float()
        self.shared = shared.detach().clone().float()
        self.beta, self.gamma, self.epsilon, self.iterations = beta, gamma, epsilon, iterations

    @property
    def active(self) -> bool:
        return self.local.shape[0] > 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.active:
            return x
        flat = x.reshape(-1, self.dim)
        with torch.no_grad():  # the stop-gradient below the GLU: no gradient reaches the plan
            unit = F.normalize(flat, dim=1)
            if self.training:
                groups = self.local.shape[0]
                bank = torch.cat([self.local, self.shared])
                plan = sinkhorn(
                    unit @ F.normalize(bank, dim=1).T,
                    epsilon=self.epsilon,
                    iterations=self.iterations,
                )
                matched = self.shared[plan[:, groups:].argmax(dim=1)]
                ema_update(self.local, flat.detach(), plan[:, :groups], self.gamma)
            else:  # inference: local prototypes only
                plan = sinkhorn(
                    unit @ F.normalize(self.local, dim=1).T,
                    epsilon=self.epsilon,
                    iterations=self.iterations,
                )
                matched = self.local[plan.argmax(dim=1)]
        a, b = self.glu(matched).chunk(2, dim=1)
        aligned = (
            self.beta * (a * torch.sigmoid(b)).reshape(x.shape) + (1.0 - self.beta) * x
        )  # Eq. 4
        return F.normalize(aligned, dim=-1)


class EncoderBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.alp = ALPLayer(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, h: Tensor) -> Tensor:
        a = self.alp(self.norm1(h))
        h = h + self.attention(a, a, a, need_weights=False)[0]
        return cast("torch.Tensor", h + self.mlp(self.norm2(h)))


def _positions(length: int, width: int) -> Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10_000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : width // 2]
    return table


class TransformerEncoderNet(EmbeddingModel):
    """Tokens = time steps; ALP after the first norm of every block."""

    arch = "transformer"
    sample_ndim = 2

    def __init__(
        self,
        *,
        num_classes: int,
        embed_dim: int = 256,
        width: int = 32,
        depth: int = 2,
        heads: int = 2,
        features: int = 32,
        max_tokens: int = 128,
    ) -> None:
        super().__init__(embed_dim=embed_dim, num_classes=num_classes)
        self.width, self.features, self.max_tokens = width, features, max_tokens
        self.project = nn.Linear(features, width)
        self.blocks = nn.ModuleList(EncoderBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, embed_dim)
        self.classifier = nn.Linear(embed_dim, num_classes)

    def alp_layers(self) -> list[ALPLayer]:
        return [block.alp for block in self.blocks if isinstance(block, EncoderBlock)]

    def embed(self, x: Tensor) -> Tensor:
        """(B, T, S) or (B, 1, T, S) amplitude windows -> (B, embed_dim)."""
        if x.dim() == 4 and x.shape[1] == 1:
            x = x.squeeze(1)
        if x.dim() != 3:
            raise ValueError(f"expected input (B, T, S) or (B, 1, T, S), got {tuple(x.shape)}")
        b, t, s = x.shape
        tokens = F.adaptive_avg_pool1d(x.reshape(b * t, 1, s), self.features).reshape(
            b, t, self.features
        )
        if t > self.max_tokens:
            tokens = F.adaptive_avg_pool1d(tokens.transpose(1, 2), self.max_tokens).transpose(1, 2)
        h = self.project(tokens)
        h = h + _positions(h.shape[1], self.width).to(h.dtype)
        for block in self.blocks:
            h = block(h)
        return cast("torch.Tensor", self.head(self.norm(h).mean(dim=1)))
