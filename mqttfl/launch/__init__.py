"""A whole federation on this machine: the broker, the coordinator and the client processes of `mqttfl run`."""
