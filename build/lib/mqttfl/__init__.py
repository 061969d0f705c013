"""mqttfl: federated learning for Wi-Fi CSI sensing over an MQTT message bus."""

from typing import Any

from mqttfl.config import RunConfig, load_config
from mqttfl.errors import (
    BrokerError,
    ConfigError,
    DataError,
    MqttflError,
    RejectedUpload,
    WireError,
)

__all__ = [
    "BrokerError",
    "ConfigError",
    "DataError",
    "MqttflError",
    "RejectedUpload",
    "RunConfig",
    "WireError",
    "algorithm_names",
    "get_algorithm",
    "load_config",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The method registry imports torch; load it only when asked, so that torch-free
    # tools (the load client, `broker init`) start fast.
    if name in ("algorithm_names", "get_algorithm"):
        from mqttfl import algorithms

        return getattr(algorithms, name)
    raise AttributeError(f"module 'mqttfl' has no attribute {name!r}")
