"""mqttfl: federated learning for Wi-Fi CSI sensing over MQTT."""
