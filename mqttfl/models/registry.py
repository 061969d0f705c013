"""Building models by name: one factory per spec of :data:`~mqttfl.models.specs.MODEL_SPECS`."""

from __future__ import annotations

from typing import Protocol

from mqttfl.models.base import EmbeddingModel
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.specs import MODEL_SPECS


class ModelFactory(Protocol):
    """Builds one model; factories ignore ``input_dim`` if they do not need it."""

    def __call__(
        self, *, num_classes: int, embed_dim: int, input_dim: int | None
    ) -> EmbeddingModel: ...


#: name -> factory, in the order of MODEL_NAMES
MODEL_FACTORIES: dict[str, ModelFactory] = {name: spec.build for name, spec in MODEL_SPECS.items()}


def build_model(
    name: str, *, num_classes: int, embed_dim: int = 256, input_dim: int | None = None
) -> EmbeddingModel:
    """Instantiate the registered model ``name``.

    Raises ``ValueError`` for an unknown name (listing the allowed ones) or a
    missing ``input_dim`` for models over feature vectors.
    """
    spec = MODEL_SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    return spec.build(num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)
