"""Print the figures of benchmarks/results/*.json as the markdown tables of BENCHMARKS.md.

    python -m benchmarks.summarize [--quick]

Reads whatever results exist (full size by default, ``-quick`` files with --quick) and
prints the section of each benchmark that has one (:data:`benchmarks.registry.BENCHMARKS`,
rendered by :mod:`benchmarks.sections`); paste it into BENCHMARKS.md after a new run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from benchmarks.common import RESULTS
from benchmarks.registry import BENCHMARKS


def _load(name: str, quick: bool) -> dict[str, Any] | None:
    path = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description="results as markdown")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for bench in BENCHMARKS:
        doc = _load(bench.result, args.quick)
        if bench.section is not None and doc is not None:
            sys.stdout.write("\n".join(bench.section(doc)) + "\n\n")


if __name__ == "__main__":
    main()
