"""benchmarks/registry.py is the one list of benchmarks: every ``bench_*.py`` has exactly one
entry, every entry a module with a ``run(quick)``, and ``run_all`` and ``summarize`` keep no
list of their own."""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.registry import BENCHMARKS, BY_NAME, default_names

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
MODULES = sorted(p.stem.removeprefix("bench_") for p in BENCHMARKS_DIR.glob("bench_*.py"))


def test_every_bench_module_has_exactly_one_entry() -> None:
    names = [b.name for b in BENCHMARKS]
    assert len(names) == len(set(names)), f"entries twice: {sorted(names)}"
    assert sorted(names) == MODULES


def test_every_entry_has_a_run_of_quick() -> None:
    """Read from the source: importing every benchmark would load torch, Flower, ..."""
    for bench in BENCHMARKS:
        tree = ast.parse((BENCHMARKS_DIR / f"bench_{bench.name}.py").read_text())
        runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
        assert len(runs) == 1, f"{bench.module} has no run()"
        args = runs[0].args
        assert [a.arg for a in args.args[:1]] == ["quick"], f"{bench.module}.run(quick, ...)"
        assert len(args.defaults) >= len(args.args) - 1, f"{bench.module}.run needs more than quick"
        assert None not in args.kw_defaults, f"{bench.module}.run needs more than quick"


def test_results_are_distinct_and_default_runs_first() -> None:
    results = [b.result for b in BENCHMARKS]
    assert len(results) == len(set(results))
    default = default_names()
    assert default == [b.name for b in BENCHMARKS[: len(default)]]
    assert set(default) <= set(BY_NAME)


def test_run_all_and_summarize_keep_no_list_of_names() -> None:
    """No tuple, list, set or dict of two or more benchmark names outside the registry."""
    for module in ("run_all", "summarize", "sections"):
        tree = ast.parse((BENCHMARKS_DIR / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                named = [
                    i.value for i in items if isinstance(i, ast.Constant) and i.value in BY_NAME
                ]
                assert len(named) < 2, f"{module}.py lists benchmarks {named} (line {node.lineno})"
