"""Weight counts without torch: what a model's flat weight vector holds, from its shapes.

The upload gate checks the length of a weight-sharing method's upload against the
announced architecture. Building the model to count would load torch in the
coordinator; these formulas mirror each model's layers instead, and a test checks them
against torch for every model (every floating state_dict entry: parameters and
BatchNorm's running statistics, not its integer batch counter; ALP prototypes are
non-persistent buffers, so they are not counted).
"""

from __future__ import annotations

from collections.abc import Sequence

from mqttfl.models.names import MODEL_NAMES

# Defaults of the models (mqttfl/models/*.py)
MLP_HIDDEN = 128
CNN_FLAT = 64 * 16
TRANSFORMER = {"width": 32, "depth": 2, "features": 32}
CONVNET4_CHANNELS = {"middle": (16, 32), "large": (16, 32, 64, 128, 256)}


def _linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def _conv(c_in: int, c_out: int, kernel: int, *, bias: bool) -> int:
    return c_in * c_out * kernel * kernel + (c_out if bias else 0)


def _batchnorm(c: int) -> int:
    return 4 * c  # weight, bias, running mean, running variance


def _layernorm(c: int) -> int:
    return 2 * c


def _convnet4(channels: Sequence[int], embed_dim: int, num_classes: int, *, head: bool) -> int:
    total, c_in = 0, 1
    for c_out in channels:
        total += _conv(c_in, c_out, 3, bias=False) + _batchnorm(c_out)
        c_in = c_out
    if head:
        total += _conv(c_in, embed_dim, 1, bias=True)
    return total + _linear(embed_dim, num_classes)


def _transformer(embed_dim: int, num_classes: int) -> int:
    width, depth, features = TRANSFORMER["width"], TRANSFORMER["depth"], TRANSFORMER["features"]
    attention = 3 * width * width + 3 * width + _linear(width, width)
    block = (
        _layernorm(width)
        + _linear(width, 2 * width)  # ALP's GLU
        + attention
        + _layernorm(width)
        + _linear(width, 2 * width)
        + _linear(2 * width, width)
    )
    return (
        _linear(features, width)
        + depth * block
        + _layernorm(width)
        + _linear(width, embed_dim)
        + _linear(embed_dim, num_classes)
    )


def alp_widths(arch: str) -> tuple[int, ...]:
    """Token width of each ALP layer (FedAli) of a model: one per transformer block."""
    if arch == "transformer":
        return (TRANSFORMER["width"],) * TRANSFORMER["depth"]
    return ()


def weight_count(arch: str, *, num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    """Length of the flat weight vector of model ``arch``; ValueError for an unknown one
    (or an MLP without its input width)."""
    if arch == "tiny":
        return _convnet4((embed_dim,), embed_dim, num_classes, head=False)
    if arch in CONVNET4_CHANNELS:
        return _convnet4(CONVNET4_CHANNELS[arch], embed_dim, num_classes, head=True)
    if arch == "cnn":
        convs = _conv(1, 32, 5, bias=True) + _conv(32, 64, 5, bias=True)
        return convs + _linear(CNN_FLAT, embed_dim) + _linear(embed_dim, num_classes)
    if arch == "mlp":
        if input_dim is None:
            raise ValueError("model 'mlp' needs input_dim (the feature-vector length)")
        encoder = _linear(input_dim, MLP_HIDDEN) + _linear(MLP_HIDDEN, embed_dim)
        return encoder + _linear(embed_dim, num_classes)
    if arch == "transformer":
        return _transformer(embed_dim, num_classes)
    raise ValueError(f"unknown model {arch!r}; known: {', '.join(MODEL_NAMES)}")
