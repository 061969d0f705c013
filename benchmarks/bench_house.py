"""The house's counts: string dispatch, untyped documents, strict type errors and private
reach-ins, read from the source (an audit, kept reproducible).

- ``string_comparisons``: ``== "`` in ``mqttfl/`` (a comparison with a string literal,
  the shape of dispatch on a name);
- ``dict_str_any``: ``dict[str, Any]`` in ``mqttfl/``;
- ``strict_errors``: mypy's errors on ``tests/`` and ``benchmarks/`` with ``--strict``;
- ``private_reach_ins``: in ``tests/`` and ``benchmarks/``, a private name (one leading
  underscore) of mqttfl's that is imported, read as an attribute, or overridden by a
  method of the same name, where the tests and benchmarks do not define that name
  themselves.

    python -m benchmarks.bench_house [--root DIR]   # another checkout, e.g. the commit before
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, bench_main

ERROR_LINE = re.compile(r"^[^:]+:\d+: error:", re.MULTILINE)


def _sources(root: Path, folder: str) -> list[Path]:
    return sorted((root / folder).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _definitions(paths: list[Path]) -> tuple[set[str], set[str]]:
    """(private names ``paths`` define, those that are methods of a subclass of an mqttfl
    class: overrides)."""
    names: set[str] = set()
    overrides: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        from_package = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mqttfl")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(base, ast.Name) and base.id in from_package for base in node.bases
            ):
                overrides.update(
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                )
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    names.add(node.attr)  # its own attribute (another object's is a reach-in)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _private(n)}, {n for n in overrides if _private(n)}


def reach_ins(root: Path) -> dict[str, Any]:
    """Private mqttfl names used by tests and benchmarks, by kind, with the names."""
    package, _ = _definitions(_sources(root, "mqttfl"))
    outside_paths = _sources(root, "tests") + _sources(root, "benchmarks")
    defined, overrides = _definitions(outside_paths)
    theirs = package - (defined - overrides)  # names only the package gives a meaning
    found: Counter[str] = Counter()
    names: set[str] = set()
    for path in outside_paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mqttfl"):
                taken = [a.name for a in node.names if _private(a.name)]
                found["imported"] += len(taken)
                names.update(taken)
            elif isinstance(node, ast.Attribute) and node.attr in theirs:
                found["attribute"] += 1
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.name in overrides & package
            ):
                found["overridden"] += 1
                names.add(node.name)
    return {"total": sum(found.values()), **found, "names": sorted(names)}


STRICT_CONFIG = """[mypy]
python_version = 3.11
plugins = pydantic.mypy
ignore_missing_imports = True
strict = True
"""


def strict_errors(root: Path) -> int:
    """mypy --strict's errors on tests/ and benchmarks/, whatever the checkout's own config
    relaxes for them."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "mypy.ini"
        config.write_text(STRICT_CONFIG)
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(config), "tests", "benchmarks"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    return len(ERROR_LINE.findall(done.stdout))


def counts(root: Path) -> dict[str, Any]:
    text = "".join(p.read_text() for p in _sources(root, "mqttfl"))
    return {
        "string_comparisons": text.count('== "'),
        "dict_str_any": text.count("dict[str, Any]"),
        "strict_errors": strict_errors(root),
        "private_reach_ins": reach_ins(root),
    }


def run(quick: bool, root: Path = REPO) -> dict[str, Any]:
    return {"what": "static counts of the house audit", "root": str(root), **counts(root)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="another checkout to count")
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args()
    if args.root is not None:
        print(json.dumps(run(args.quick, args.root.resolve()), indent=1))
    else:
        bench_main("house", __doc__.splitlines()[0], run)
