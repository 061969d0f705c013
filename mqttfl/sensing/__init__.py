"""``mqttfl sense``: an exported model reading CSI on a device, without torch.

:mod:`~mqttfl.sensing.spec` reads ``sensor.json``; :mod:`~mqttfl.sensing.pipeline` turns
packets into normalized windows exactly as ``data prepare`` and the built-in sources do;
:mod:`~mqttfl.sensing.frames` decodes a gateway's frames, :mod:`~mqttfl.sensing.inlet`
reads them off the broker into a bounded buffer (a flood drops its oldest) and
:mod:`~mqttfl.sensing.gateway` cuts them into windows; :mod:`~mqttfl.sensing.replay`
reads capture files and shards; :mod:`~mqttfl.sensing.model` runs the ONNX model with
onnxruntime; :mod:`~mqttfl.sensing.publish` says what goes to the broker (state, Home
Assistant discovery, availability) and :mod:`~mqttfl.sensing.runner` ties them together.
Nothing here imports torch (a test checks it).
"""
