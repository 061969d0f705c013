"""The names ``build_model`` accepts, importable without torch.

The config validates ``model.name`` and ``model.per_client`` against this tuple, so a
typo fails when the config is loaded, not minutes later in every client process. The
names are those of :data:`~mqttfl.models.specs.MODEL_SPECS`, in its order (the order
``mqttfl models`` lists them in).
"""

from __future__ import annotations

from mqttfl.models.specs import MODEL_SPECS

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_SPECS)
