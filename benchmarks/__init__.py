"""mqttfl benchmarks: speed, bytes and accuracy, each writing JSON to benchmarks/results/.

Run them with ``python -m benchmarks.run_all [--quick] [--only NAME | --all]``; the list of
benchmarks is :mod:`benchmarks.registry`, and docs/benchmarks/ carries the latest figures.
The package imports nothing from here; benchmarks import only mqttfl's public names
(tests/test_layout.py). Some tests check a benchmark's own logic (tests/test_crossroom.py,
tests/test_compare_entries.py, tests/test_benchmark_statistics.py, ...). This ``__init__``
imports nothing, so importing one benchmark loads no other.
"""
