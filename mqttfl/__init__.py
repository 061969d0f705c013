"""mqttfl: federated learning for Wi-Fi CSI sensing over an MQTT message bus."""

from mqttfl.algorithms import algorithm_names, get_algorithm
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
