"""Test-time adaptation that runs without torch: the prototype refinement and the shift
gate, shared by a method's evaluation (:mod:`mqttfl.algorithms.fedapa.session`) and the
deployed sensor (:mod:`mqttfl.sensing`), so both decide and predict alike."""
