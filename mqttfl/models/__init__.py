"""Model zoo and registry.

Every model is an :class:`EmbeddingModel` (encoder ``embed`` + classifier
``classify``, FedAPA Sec. III-B).  What each architecture is (its class, weight count,
the samples it takes) is one :class:`~mqttfl.models.specs.ModelSpec` in
:data:`~mqttfl.models.specs.MODEL_SPECS`; to add a model, write its class and add one
entry there. ``build_model`` and ``MODEL_FACTORIES`` build from that table.

``MODEL_NAMES`` and the specs are importable without torch; everything else is loaded
on first use, so that the config (which validates model names) stays torch-free.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.specs import MODEL_SPECS, ModelSpec

if TYPE_CHECKING:
    from mqttfl.models.base import EmbeddingModel
    from mqttfl.models.cnn import ImageCNN
    from mqttfl.models.convnet4 import ConvNet4, LargeConvNet4, MiddleConvNet4, TinyConvNet4
    from mqttfl.models.mlp import FeatureMLP
    from mqttfl.models.registry import MODEL_FACTORIES, ModelFactory, build_model
    from mqttfl.models.transformer import TransformerEncoderNet

_LAZY = {
    "ConvNet4": "mqttfl.models.convnet4",
    "EmbeddingModel": "mqttfl.models.base",
    "FeatureMLP": "mqttfl.models.mlp",
    "ImageCNN": "mqttfl.models.cnn",
    "LargeConvNet4": "mqttfl.models.convnet4",
    "MODEL_FACTORIES": "mqttfl.models.registry",
    "MiddleConvNet4": "mqttfl.models.convnet4",
    "ModelFactory": "mqttfl.models.registry",
    "TinyConvNet4": "mqttfl.models.convnet4",
    "TransformerEncoderNet": "mqttfl.models.transformer",
    "build_model": "mqttfl.models.registry",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mqttfl.models' has no attribute {name!r}")


__all__ = [
    "MODEL_FACTORIES",
    "MODEL_NAMES",
    "MODEL_SPECS",
    "ConvNet4",
    "EmbeddingModel",
    "FeatureMLP",
    "ImageCNN",
    "LargeConvNet4",
    "MiddleConvNet4",
    "ModelFactory",
    "ModelSpec",
    "TinyConvNet4",
    "TransformerEncoderNet",
    "build_model",
]
