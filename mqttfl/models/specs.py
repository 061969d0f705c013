"""One spec per architecture: its class, its weight count and the samples it takes.

Three rooms ask what a model is: the config (is the name known?), the coordinator's
upload gate (how long is its weight vector? can it run on these samples?) and the
clients (build it). They ask this table, so adding a model is one entry here (and its
class). Nothing here imports torch: the class is named as ``"module:Class"`` and
imported when a model is built, and the weight counts are formulas that mirror each
model's layers (``tests/test_model_sizes.py`` checks them against torch). A weight
count covers every floating state_dict entry: parameters and BatchNorm's running
statistics, not its integer batch counter; ALP prototypes are non-persistent buffers,
so they are not counted.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from mqttfl.models.base import EmbeddingModel

#: What one sample is: a (T, S) window (also (1, T, S)) or a feature vector (N,).
SampleKind = Literal["window", "vector"]

#: How each kind reads in a message naming what a model takes.
TAKES: Mapping[SampleKind, str] = {
    "window": "windows (T, S) or (1, T, S)",
    "vector": "feature vectors (N,)",
}

# Defaults of the models (mqttfl/models/*.py)
MLP_HIDDEN = 128
CNN_FLAT = 64 * 16
TRANSFORMER = {"width": 32, "depth": 2, "features": 32}
CONVNET4_CHANNELS = {"middle": (16, 32), "large": (16, 32, 64, 128, 256)}


def sample_kind(shape: tuple[int, ...]) -> SampleKind | None:
    """The kind of a sample of this shape, by its rank; None when no model takes it."""
    if len(shape) == 1:
        return "vector"
    if len(shape) == 2 or (len(shape) == 3 and shape[0] == 1):
        return "window"
    return None


#: (num_classes, embed_dim, input_dim) -> length of the flat weight vector
WeightCount = Callable[[int, int, int | None], int]


@dataclass(frozen=True)
class ModelSpec:
    """What one architecture is, without torch."""

    name: str
    #: the class, as ``"module:Class"``; imported only when a model is built
    model_class: str
    weights: WeightCount
    takes: SampleKind = "window"
    #: token width of each ALP layer (FedAli): one per transformer block
    alp_widths: tuple[int, ...] = ()
    #: built for a feature-vector length (``input_dim``), which it then requires
    needs_input_dim: bool = False

    def weight_count(self, *, num_classes: int, embed_dim: int, input_dim: int | None) -> int:
        """Length of the flat weight vector (ValueError for an MLP without input_dim)."""
        self._check_input_dim(input_dim)
        return self.weights(num_classes, embed_dim, input_dim)

    def build(self, *, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
        """The torch model; ``input_dim`` is ignored unless the model needs it."""
        self._check_input_dim(input_dim)
        module, _, attr = self.model_class.partition(":")
        model_class: Callable[..., EmbeddingModel] = getattr(importlib.import_module(module), attr)
        extra: dict[str, object] = {"input_dim": input_dim} if self.needs_input_dim else {}
        return model_class(num_classes=num_classes, embed_dim=embed_dim, **extra)

    def _check_input_dim(self, input_dim: int | None) -> None:
        if self.needs_input_dim and input_dim is None:
            raise ValueError(f"model {self.name!r} needs input_dim (the feature-vector length)")


# --- weight counts, layer by layer ------------------------------------------------------


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


def _tiny(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    return _convnet4((embed_dim,), embed_dim, num_classes, head=False)


def _middle(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    return _convnet4(CONVNET4_CHANNELS["middle"], embed_dim, num_classes, head=True)


def _large(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    return _convnet4(CONVNET4_CHANNELS["large"], embed_dim, num_classes, head=True)


def _cnn(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    convs = _conv(1, 32, 5, bias=True) + _conv(32, 64, 5, bias=True)
    return convs + _linear(CNN_FLAT, embed_dim) + _linear(embed_dim, num_classes)


def _mlp(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    assert input_dim is not None  # ModelSpec.weight_count checked it
    encoder = _linear(input_dim, MLP_HIDDEN) + _linear(MLP_HIDDEN, embed_dim)
    return encoder + _linear(embed_dim, num_classes)


def _transformer(num_classes: int, embed_dim: int, input_dim: int | None) -> int:
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


# --- the table: in the order `mqttfl models` lists them ---------------------------------

_SPECS = (
    ModelSpec("tiny", "mqttfl.models.convnet4:TinyConvNet4", _tiny),
    ModelSpec("middle", "mqttfl.models.convnet4:MiddleConvNet4", _middle),
    ModelSpec("large", "mqttfl.models.convnet4:LargeConvNet4", _large),
    ModelSpec("mlp", "mqttfl.models.mlp:FeatureMLP", _mlp, takes="vector", needs_input_dim=True),
    ModelSpec("cnn", "mqttfl.models.cnn:ImageCNN", _cnn),
    ModelSpec(
        "transformer",
        "mqttfl.models.transformer:TransformerEncoderNet",
        _transformer,
        alp_widths=(TRANSFORMER["width"],) * TRANSFORMER["depth"],
    ),
)

#: name -> spec, one per architecture
MODEL_SPECS: Mapping[str, ModelSpec] = {spec.name: spec for spec in _SPECS}
if len(MODEL_SPECS) != len(_SPECS):
    raise RuntimeError(f"a model name is registered twice: {[s.name for s in _SPECS]}")
