"""The live view of a run, read only from the broker (`mqttfl watch`)."""
