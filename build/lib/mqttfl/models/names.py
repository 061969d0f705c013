"""The names ``build_model`` accepts, importable without torch.

The config validates ``model.name`` and ``model.per_client`` against this tuple, so a
typo fails when the config is loaded, not minutes later in every client process.
:mod:`mqttfl.models.registry` holds one factory per name, in this order (the order
``mqttfl models`` lists them in), and refuses to import if the two disagree.
"""

from __future__ import annotations

MODEL_NAMES: tuple[str, ...] = ("tiny", "middle", "large", "mlp", "cnn", "transformer")
