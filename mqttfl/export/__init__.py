"""``mqttfl export``: a client's evaluation model as ONNX, with its ``sensor.json``.

:mod:`mqttfl.export.sensor` turns a shard's metadata into the preprocessing a sensor
needs (numpy only); :mod:`mqttfl.export.client` rebuilds the client from its run
directory and state file and traces its method's evaluation model (torch).
"""
