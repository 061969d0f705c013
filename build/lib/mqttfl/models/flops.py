"""Parameter and FLOP counts, the numbers of FedAPA Table II.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``, which counts
matmuls and convolutions (one multiply-add = 2 FLOPs) but not BatchNorm, ReLU or
pooling.  At the paper's 1000x242 input this gives 278.8 / 158.0 / 600.6 MFLOPs
for Tiny / Middle / Large against Table II's 340.75 / 162.85 / 606.35: the paper
also counts element-wise layers, which weigh most in Tiny's single wide block.
The ordering (Large > Tiny > Middle) is the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from mqttfl.models import MODEL_NAMES, build_model


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def count_flops(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward pass on one sample of shape ``input_shape`` (no batch dim).

    Runs in eval mode (BatchNorm uses running stats, as at inference) and restores
    the model's previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        x = torch.zeros((1, *input_shape))
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            model(x)
        return int(counter.get_total_flops())
    finally:
        model.train(was_training)


def describe_models(
    num_classes: int, input_hw: tuple[int, int], embed_dim: int = 256
) -> list[dict[str, Any]]:
    """One row per registered model: name, class, parameters, flops, input_shape.

    Window models see one (H, W) sample; vector models see H*W features, as if the
    window were flattened.
    """
    h, w = input_hw
    rows: list[dict[str, Any]] = []
    for name in MODEL_NAMES:
        model = build_model(name, num_classes=num_classes, embed_dim=embed_dim, input_dim=h * w)
        shape: tuple[int, ...] = (h, w) if model.sample_ndim == 2 else (h * w,)
        rows.append(
            {
                "name": name,
                "class": type(model).__name__,
                "parameters": count_parameters(model),
                "flops": count_flops(model, shape),
                "input_shape": list(shape),
            }
        )
    return rows
