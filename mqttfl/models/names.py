"""The names ``build_model`` accepts, importable without torch.

The config validates ``model.name`` and ``model.per_client`` against this tuple, so a
typo fails when the config is loaded, not minutes later in every client process.
:mod:`mqttfl.models.registry` holds one factory per name, in this order (the order
``mqttfl models`` lists them in), and refuses to import if the two disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqttfl.wire.ids import client_number

if TYPE_CHECKING:
    from mqttfl.config import ModelConfig

MODEL_NAMES: tuple[str, ...] = ("tiny", "middle", "large", "mlp", "cnn", "transformer")


def model_for(model: ModelConfig, client_id: str) -> str:
    """The architecture client ``client_id`` runs: the one id -> model mapping of mqttfl
    (``model.per_client`` cycled by :func:`~mqttfl.wire.ids.client_number`), used by
    clients, the checks before a run, and the Local and pooled references alike."""
    return model.arch_for(client_number(client_id))
