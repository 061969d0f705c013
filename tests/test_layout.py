"""The house's rules, read from the source: imports point one way, no cycles, nothing
private crosses a module boundary, and no file outgrows ~500 lines. The benchmarks keep the
same rules: they import mqttfl's public names only, never the tests, and stay small. The
figures the architecture page counts with ``grep`` are the code's.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import
is still an arrow between rooms.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mqttfl"
BENCHMARKS = PACKAGE.parent / "benchmarks"

#: A room may import only rooms of a lower rank (never one of its own rank or above).
RANK = {
    "errors": 0,
    "logs": 1,
    "paths": 1,
    "processes": 1,  # children that end with their parent (prctl)
    "files": 2,  # atomic writes, JSON lines read up to their last complete line
    "wire": 2,  # topics, ids, codec, schemas, control messages, chunk framing
    "models": 2,
    "adaptation": 2,  # torch-free test-time adaptation: refinement, moments, shift gate
    "config": 3,
    "pidfile": 3,  # a client process's name and pid file
    "data": 4,
    "training": 4,
    "privacy": 4,  # DP mechanisms on uploads and the accountant (dp-accounting)
    "algorithms": 5,
    "engine": 6,  # the pure round loop: no MQTT
    "bus": 6,  # MQTT transport
    "provisioning": 7,
    "sensing": 7,  # torch-free: an exported model on CSI, readings to MQTT
    "nodes": 8,  # the coordinator and the clients: adapters of the engine over the bus
    "monitor": 9,
    "launch": 9,
    "testing": 9,
    "export": 9,  # a finished run's client rebuilt and traced to ONNX
    "evaluation": 10,
    "commands": 11,
    "__init__": 12,  # the package's public surface
    "__main__": 12,
}
#: config checks ``model.name`` against the torch-free tuple of model names.
ALLOWED = {("config", "mqttfl.models.names")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every mqttfl import in ``path``."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("mqttfl")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "mqttfl":  # from mqttfl import x: x is a room or a module
                found += [(f"mqttfl.{a.name}", []) for a in node.names]
            elif node.module.startswith("mqttfl."):
                found.append((node.module, [a.name for a in node.names]))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))
MODULES = {_module_name(p): p for p in SOURCES}


def test_every_room_has_a_rank() -> None:
    rooms = {_room(m) for m in MODULES}
    assert rooms <= set(RANK), f"rooms without a rank: {sorted(rooms - set(RANK))}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    module = _module_name(path)
    room = _room(module)
    wrong = []
    for target, _ in _imports(path):
        other = _room(target)
        if other == room or (room, target) in ALLOWED:
            continue
        if RANK[other] >= RANK[room]:
            wrong.append(
                f"{module} imports {target} ({room} {RANK[room]} -> {other} {RANK[other]})"
            )
    assert not wrong, "\n".join(wrong)


def test_the_engine_and_the_wire_know_no_transport() -> None:
    """The two arrows that matter most, spelled out: the round engine runs without MQTT and
    the wire format imports nothing of the runtime."""
    for path in SOURCES:
        module = _module_name(path)
        targets = {_room(t) for t, _ in _imports(path)}
        if _room(module) == "engine":
            assert not targets & {"bus", "nodes", "provisioning"}, module
        if _room(module) == "wire":
            assert targets <= {"wire", "errors"}, module


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_private_crosses_a_module(path: Path) -> None:
    module = _module_name(path)
    wrong = _private_reaches(path, module)
    assert not wrong, f"{module} reaches into: {wrong}"


def _private_reaches(path: Path, module: str) -> list[str]:
    """The private mqttfl names ``path`` (module ``module``) takes from another module."""
    tree = ast.parse(path.read_text())
    aliases = {}  # local name -> mqttfl module it stands for
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mqttfl"):
            for a in node.names:
                if a.name.startswith("_") and node.module != module:
                    wrong.append(f"from {node.module} import {a.name}")
                if f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mqttfl") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            wrong.append(f"{aliases[node.value.id]}.{node.attr}")
    return wrong


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for target, names in _imports(path):
            # `from mqttfl.x import y` where y is a module is an arrow to mqttfl.x.y
            for name in names or [""]:
                full = f"{target}.{name}" if name and f"{target}.{name}" in MODULES else target
                if full in MODULES and full != module:
                    graph[module].add(full)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_outgrows_the_limit(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 520, f"{path} is past ~500 lines: split it"


BENCH_SOURCES = sorted(BENCHMARKS.glob("*.py"))
#: bench_hostile_peer drives the fault-injection federation of the tests (tests/faults.py).
BENCH_ALLOWED = {("benchmarks.bench_hostile_peer", "tests.faults")}


def _bench_id(path: Path) -> str:
    return path.name


def _top_imports(path: Path) -> list[str]:
    """Every absolute import of ``path`` (also lazy ones), as module names."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


@pytest.mark.parametrize("path", BENCH_SOURCES, ids=_bench_id)
def test_benchmarks_take_only_public_names(path: Path) -> None:
    module = f"benchmarks.{path.stem}"
    wrong = _private_reaches(path, module)
    assert not wrong, f"{module} reaches into: {wrong}"


@pytest.mark.parametrize("path", BENCH_SOURCES, ids=_bench_id)
def test_benchmarks_import_the_package_never_the_tests(path: Path) -> None:
    """A benchmark sits above the whole package: it may import any room of mqttfl and the
    other benchmarks, never the tests (their helpers are not an interface)."""
    module = f"benchmarks.{path.stem}"
    wrong = [
        target
        for target in _top_imports(path)
        if target.split(".")[0] == "tests" and (module, target) not in BENCH_ALLOWED
    ]
    assert not wrong, f"{module} imports {wrong}"


def test_the_package_imports_no_benchmark_and_no_test() -> None:
    wrong = [
        f"{_module_name(path)} imports {target}"
        for path in SOURCES
        for target in _top_imports(path)
        if target.split(".")[0] in ("benchmarks", "tests")
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", BENCH_SOURCES, ids=_bench_id)
def test_no_benchmark_outgrows_the_limit(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 520, f"{path} is past ~500 lines: split it"


ARCHITECTURE = PACKAGE.parent / "docs" / "explanation" / "architecture.md"
GREP_ROW = re.compile(
    r"^\| [^|]+ \| `grep -rn '(?P<pattern>[^']+)' mqttfl \\\| wc -l` \| [^|]+ \| (?P<now>\d+)"
)


def _from_basic_regex(basic: str) -> str:
    """grep's basic regex as Python's: there ``(){}+?|`` are plain characters."""
    out, chars = [], iter(basic)
    for char in chars:
        if char == "\\":
            out.append(char + next(chars, ""))
        else:
            out.append("\\" + char if char in "(){}+?|" else char)
    return "".join(out)


def test_the_house_figures_on_the_architecture_page_are_the_codes() -> None:
    """Each figure the architecture page gives with a ``grep -rn ... | wc -l`` command is
    what that command counts in the package now (lines that match, as grep counts)."""
    rows = [m for line in ARCHITECTURE.read_text().splitlines() if (m := GREP_ROW.match(line))]
    assert len(rows) >= 3, "the page's table of figures has lost its grep rows"
    for row in rows:
        pattern = re.compile(_from_basic_regex(row["pattern"]))
        counted = sum(
            1 for path in SOURCES for line in path.read_text().splitlines() if pattern.search(line)
        )
        assert counted == int(row["now"]), (
            f"architecture.md says {row['now']} lines match {row['pattern']!r}; the code has "
            f"{counted}: give the page the new figure"
        )
