"""The MQTT transport: a reconnecting aiomqtt client with chunking for large messages."""
