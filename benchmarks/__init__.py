"""mqttfl benchmarks: speed, bytes and accuracy, each writing JSON to benchmarks/results/.

Run them all with ``python -m benchmarks.run_all [--quick] [--only NAME]``; BENCHMARKS.md
carries the latest figures. The package imports nothing from here. Two tests check a
benchmark's own logic: tests/test_crossroom.py (bench_crossroom's room split and summary)
and tests/test_compare_entries.py (bench_accuracy's FedAli recipe). This ``__init__``
imports nothing, so importing one benchmark loads no other.
"""
