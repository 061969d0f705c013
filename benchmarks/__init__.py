"""mqttfl benchmarks: speed, bytes and accuracy, each writing JSON to benchmarks/results/.

Run them all with ``python -m benchmarks.run_all [--quick] [--only NAME]``; BENCHMARKS.md
carries the latest figures. Nothing here is imported by the package or by the tests, and
this ``__init__`` imports nothing, so the torch-free load publisher stays torch-free.
"""
