"""The pure round loop: selection, deadlines, the upload gate, aggregation, the journal and the run state. Clock-injected; imports no MQTT."""
