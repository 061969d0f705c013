"""Every benchmark, once: its name, how it runs, the section it prints as, and whether
``python -m benchmarks.run_all`` runs it by default.

``run_all`` and ``summarize`` read :data:`BENCHMARKS` and hold no list of their own;
tests/test_benchmark_registry.py checks that every ``benchmarks/bench_*.py`` has exactly one
entry here and every entry its module. Adding a benchmark is one module and one entry.

An entry imports nothing: its module (``benchmarks.bench_NAME``, which may need torch,
Flower or a data set) is imported when the benchmark runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import sections

#: Renders one result document as the markdown lines of its benchmark page's section.
Section = Callable[[dict[str, Any]], list[str]]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``benchmarks/bench_<name>.py`` with a ``run(quick) -> dict``."""

    name: str
    #: ``run_all`` runs it without ``--only`` (the others are long, need hardware or data
    #: this machine may lack, or are studies rerun by hand: ``--only NAME`` or ``--all``).
    default: bool
    #: the markdown ``summarize`` prints from its result; None: the benchmark pages' prose
    #: carries its figures, written by hand
    section: Section | None = None
    #: benchmarks/results/<result>[-quick].json; the name unless the module writes another
    result: str = ""

    def __post_init__(self) -> None:
        if not self.result:
            object.__setattr__(self, "result", self.name)

    @property
    def module(self) -> str:
        return f"benchmarks.bench_{self.name}"

    def run(self, quick: bool) -> dict[str, Any]:
        """Import the benchmark's module and run it at smoke size (``quick``) or full size."""
        run: Callable[[bool], dict[str, Any]] = importlib.import_module(self.module).run
        return run(quick)


#: In the order ``run_all`` runs them (and ``summarize`` prints them): fast ones first.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("codec", True, sections.codec),
    Benchmark("aggregation", True, sections.aggregation),
    Benchmark("fanin", True, sections.fanin),
    Benchmark("coordinator", True, sections.coordinator),
    Benchmark("scale", True, sections.scale),
    Benchmark("round", True, sections.round_),
    Benchmark("bytes", True, sections.bytes_),
    Benchmark("flower", True, sections.flower),
    Benchmark("fleet", True, sections.fleet),
    Benchmark("crossroom", True, sections.crossroom),
    Benchmark("accuracy", True, sections.accuracy),
    Benchmark("fedapa_deviation", False),
    Benchmark("fedapa_bounded_accuracy", False),
    Benchmark("learning", False),
    Benchmark("calibration", False),
    Benchmark("first_contact", False),
    Benchmark("startup", False),
    Benchmark("sessions", False),
    Benchmark("session_drift", False, result="session-drift"),
    Benchmark("session_selection", False),
    Benchmark("method_choice", False),
    Benchmark("session_inference", False),
    Benchmark("prototype_alignment", False),
    Benchmark("buffered", False),
    Benchmark("reference_workers", False),
    Benchmark("device", False),
    Benchmark("many_clients", False),
    Benchmark("simulation", False),
    Benchmark("install_roles", False),
    Benchmark("sense", False),
    Benchmark("sense_flood", False),
    Benchmark("sense_injected", False),
    Benchmark("hostile_peer", False),
    Benchmark("privacy", False),
    Benchmark("house", False),
)

BY_NAME: dict[str, Benchmark] = {b.name: b for b in BENCHMARKS}


def default_names() -> list[str]:
    """The names ``run_all`` runs without ``--only``, in their order."""
    return [b.name for b in BENCHMARKS if b.default]
