"""mqttfl: federated learning for Wi-Fi CSI sensing over an MQTT message bus."""

from typing import TYPE_CHECKING, Any

from mqttfl.errors import (
    BrokerError,
    ConfigError,
    DataError,
    MqttflError,
    RejectedUpload,
    WireError,
)

if TYPE_CHECKING:
    from mqttfl.algorithms import algorithm_names, get_algorithm
    from mqttfl.config import RunConfig, load_config

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
    # Loaded only when asked: the method registry imports torch, and the config's models
    # take a third of a second to build, which `mqttfl logs` and a reader of the error
    # classes never use.
    if name in ("algorithm_names", "get_algorithm"):
        from mqttfl import algorithms

        return getattr(algorithms, name)
    if name in ("RunConfig", "load_config"):
        from mqttfl import config

        return getattr(config, name)
    raise AttributeError(f"module 'mqttfl' has no attribute {name!r}")
