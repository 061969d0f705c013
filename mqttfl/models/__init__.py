"""Model zoo and registry.

Every model is an :class:`EmbeddingModel` (encoder ``embed`` + classifier
``classify``, FedAPA Sec. III-B).  ``build_model`` looks the name up in
``MODEL_FACTORIES``; to add a model, write a factory with the keyword-only signature
of :class:`ModelFactory` and add one entry to that dict.
"""

from __future__ import annotations

from typing import Protocol

from mqttfl.models.base import EmbeddingModel
from mqttfl.models.cnn import ImageCNN
from mqttfl.models.convnet4 import ConvNet4, LargeConvNet4, MiddleConvNet4, TinyConvNet4
from mqttfl.models.mlp import FeatureMLP
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


#: name -> factory; the order is the order `mqttfl models` lists them in
MODEL_FACTORIES: dict[str, ModelFactory] = {
    "tiny": _tiny,
    "middle": _middle,
    "large": _large,
    "mlp": _mlp,
    "cnn": _cnn,
    "transformer": _transformer,
}

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_FACTORIES)


def build_model(
    name: str, *, num_classes: int, embed_dim: int = 256, input_dim: int | None = None
) -> EmbeddingModel:
    """Instantiate the registered model ``name``.

    Raises ``ValueError`` for an unknown name (listing the allowed ones) or a
    missing ``input_dim`` for models over feature vectors.
    """
    try:
        factory = MODEL_FACTORIES[name]
    except KeyError:
        allowed = ", ".join(MODEL_FACTORIES)
        raise ValueError(f"unknown model {name!r}; allowed: {allowed}") from None
    return factory(num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)


__all__ = [
    "MODEL_FACTORIES",
    "MODEL_NAMES",
    "ConvNet4",
    "EmbeddingModel",
    "FeatureMLP",
    "ImageCNN",
    "LargeConvNet4",
    "MiddleConvNet4",
    "ModelFactory",
    "TinyConvNet4",
    "TransformerEncoderNet",
    "build_model",
]
