"""The source files a module's code path imports, from the import graph (no hand list).

Read statically: every ``import mqttfl.x`` and ``from mqttfl.x import y`` at any depth of
a module (inside functions too: mqttfl imports torch-heavy modules late), each package's
``__init__`` on the way, and module names written as strings (``"mqttfl.models.convnet4"``:
the lazy registries import by name). Followed transitively, within the package only.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

_MODULE_NAME = re.compile(r"^mqttfl(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _file_of(package: Path, module: str) -> Path | None:
    """``mqttfl.a.b`` -> ``<package>/a/b.py`` or ``<package>/a/b/__init__.py``."""
    parts = module.split(".")[1:]
    base = package.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


@functools.lru_cache(maxsize=1024)
def _imported(source: bytes) -> frozenset[str]:
    """The package modules one file's source names (cached by its bytes)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from mqttfl.algorithms import fedapa` imports a submodule
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_NAME.match(node.value)
        ):
            names.add(node.value)
    return frozenset(name for name in names if name == "mqttfl" or name.startswith("mqttfl."))


def import_closure(module: str, package: Path) -> list[Path]:
    """Every source file of ``package`` (the ``mqttfl`` directory) that ``module``'s code
    path imports, itself included, sorted."""
    seen: dict[Path, None] = {}
    pending = list(_with_parents(module))
    while pending:
        name = pending.pop()
        file = _file_of(package, name)
        if file is None or file in seen:
            continue
        seen[file] = None
        for imported in _imported(file.read_bytes()):
            pending += _with_parents(imported)
    return sorted(seen)
