"""The model registry: one factory per name of :data:`~mqttfl.models.names.MODEL_NAMES`."""

from __future__ import annotations

from typing import Protocol

from mqttfl.models.base import EmbeddingModel
from mqttfl.models.cnn import ImageCNN
from mqttfl.models.convnet4 import LargeConvNet4, MiddleConvNet4, TinyConvNet4
from mqttfl.models.mlp import FeatureMLP
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.transformer import TransformerEncoderNet


class ModelFactory(Protocol):
    """Builds one model; factories ignore ``input_dim`` if they do not need it."""

    def __call__(
        self, *, num_classes: int, embed_dim: int, input_dim: int | None
    ) -> EmbeddingModel: ...


def _tiny(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    return TinyConvNet4(num_classes=num_classes, embed_dim=embed_dim)


def _middle(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    return MiddleConvNet4(num_classes=num_classes, embed_dim=embed_dim)


def _large(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    return LargeConvNet4(num_classes=num_classes, embed_dim=embed_dim)


def _cnn(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    return ImageCNN(num_classes=num_classes, embed_dim=embed_dim)


def _mlp(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    if input_dim is None:
        raise ValueError("model 'mlp' needs input_dim (the feature-vector length)")
    return FeatureMLP(input_dim=input_dim, num_classes=num_classes, embed_dim=embed_dim)


def _transformer(*, num_classes: int, embed_dim: int, input_dim: int | None) -> EmbeddingModel:
    return TransformerEncoderNet(num_classes=num_classes, embed_dim=embed_dim)


#: name -> factory, in the order of MODEL_NAMES
MODEL_FACTORIES: dict[str, ModelFactory] = {
    "tiny": _tiny,
    "middle": _middle,
    "large": _large,
    "mlp": _mlp,
    "cnn": _cnn,
    "transformer": _transformer,
}

if tuple(MODEL_FACTORIES) != MODEL_NAMES:  # the config validates names against MODEL_NAMES
    raise RuntimeError(
        f"models.names.MODEL_NAMES {MODEL_NAMES} != registry factories {tuple(MODEL_FACTORIES)}"
    )


def build_model(
    name: str, *, num_classes: int, embed_dim: int = 256, input_dim: int | None = None
) -> EmbeddingModel:
    """Instantiate the registered model ``name``.

    Raises ``ValueError`` for an unknown name (listing the allowed ones) or a
    missing ``input_dim`` for models over feature vectors.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    return MODEL_FACTORIES[name](num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)
