"""docs/events.md against the code: every log event the package can emit is in the
catalogue, with its levels and fields, and the catalogue names nothing the code lost.

The events are found with :mod:`ast`, never by running anything. A log call is
``X.debug/info/warning/error/exception/critical(NAME, ...)`` or ``X.log(LEVEL, NAME, ...)``
on a logger (``self.log``, ``log``, ``self._log``, ``runner.log``, ``get_logger(...)``), or
a call of a local name bound to such a method (``level = log.info if ok else
log.warning``). NAME is a string literal or is built from literals: a local variable, a
conditional expression, an f-string. An f-string's fields are expanded where the code
says what they hold (a constructor keyword stored on ``self``, a function returning
literals); a field it does not is a ``*``, which the catalogue must document as it is.
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mqttfl"
CATALOGUE = REPO / "docs" / "events.md"

METHODS = {"debug", "info", "warning", "error", "exception", "critical"}
LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warning", "ERROR": "error"}
LOGGERS = {"log", "_log", "logger", "_logger"}  # the names a logger goes by
MAKERS = {"get_logger", "bind"}  # calls that return a logger
WILD = "*"

#: ``noun.verb``: lower-case words joined by ``_``, two or more parts joined by ``.``.
DOTTED = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*(?:\.[a-z][a-z0-9]*(?:_[a-z0-9]+)*)+")
#: Verb words that are not -ed/-ing: irregular participles, and present-tense verbs.
VERB_WORDS = {"sent", "resent", "held", "lost", "gone", "set", "fell", "taken"}
VERB_WORDS |= {"exceeds", "drowns"}
#: What a thing came to be (``client.online``, ``site.down``): the house's state events.
STATES = {"online", "offline", "up", "down"}
#: Names in the code that say no verb (reported, not renamed here). A name fixed leaves
#: this set; a new one must not join it.
NOT_VERBS = {
    "broker.mqtt311",
    "broker.unreachable",
    "client.unresponsive",
    "downlink.inconsistent",
    "fedsap.curriculum_inactive",
    "fedsap.pseudo_labels",
    "lookup.unreachable",
    "manifest.unreachable",
    "reference.unreadable",
    "run.summary",
    "upload.late",
}


@dataclass
class Event:
    levels: set[str] = field(default_factory=set)
    fields: set[str] = field(default_factory=set)
    sites: list[str] = field(default_factory=list)  # file:line of each call


# --- the code ---------------------------------------------------------------------------
@dataclass
class Call:
    """A call that may log, where it is: its function (or module) and class."""

    path: Path
    node: ast.Call
    scope: ast.AST
    owner: ast.ClassDef | None


@dataclass
class Package:
    calls: list[Call] = field(default_factory=list)
    functions: dict[str, list[ast.AST]] = field(default_factory=lambda: defaultdict(list))
    keywords: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    aliases: set[str] = field(default_factory=set)  # names bound to a logger's method


class _Indexer(ast.NodeVisitor):
    """One walk of a module: its calls that may log, its functions, the string literals
    passed as keywords, the names bound to a logger's method."""

    def __init__(self, path: Path, tree: ast.Module, package: Package) -> None:
        self.path, self.package = path, package
        self.scope: ast.AST = tree
        self.owner: ast.ClassDef | None = None

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.owner = self.owner, node
        self.generic_visit(node)
        self.owner = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.package.functions[node.name].append(node)
        outer, self.scope = self.scope, node
        self.generic_visit(node)
        self.scope = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        if _method_levels(node.value) is not None:
            self.package.aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        for kw in node.keywords:
            value = kw.value
            if kw.arg and isinstance(value, ast.Constant) and isinstance(value.value, str):
                self.package.keywords[(callee, kw.arg)].add(value.value)
        if isinstance(func, ast.Name) or (
            isinstance(func, ast.Attribute) and func.attr in METHODS | {"log"}
        ):
            self.package.calls.append(Call(self.path, node, self.scope, self.owner))
        self.generic_visit(node)


@cache
def _package() -> Package:
    package = Package()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        _Indexer(path, tree, package).visit(tree)
    return package


def _assigned(name: str, scope: ast.AST) -> list[ast.expr]:
    """What ``name`` is bound to in ``scope`` (plain, annotated and walrus assignments)."""
    return _bindings(scope).get(name, [])


@cache
def _bindings(scope: ast.AST) -> dict[str, list[ast.expr]]:
    found: dict[str, list[ast.expr]] = defaultdict(list)
    for node in ast.walk(scope):
        value: ast.expr | None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.NamedExpr | ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                found[target.id].append(value)
    return found


def _attribute_values(owner: ast.ClassDef, attr: str) -> set[str] | None:
    """``self.attr`` set in ``owner.__init__`` from a parameter: the parameter's default
    and every literal a caller of the class passes for it; None if the code does not say."""
    init = next(
        (n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is None:
        return None
    for node in ast.walk(init):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Name):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Attribute) and target.attr == attr:
            param = node.value.id
            args = init.args
            named = [a.arg for a in args.posonlyargs + args.args]
            defaults = dict(zip(named[::-1], args.defaults[::-1], strict=False))
            defaults |= {
                a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d
            }
            values = set(_package().keywords.get((owner.name, param), set()))
            default = defaults.get(param)
            if isinstance(default, ast.Constant) and isinstance(default.value, str):
                values.add(default.value)
            return values or None
    return None


def _returned(name: str) -> set[str] | None:
    """The literals the one function called ``name`` returns (None counts as no event)."""
    defs = _package().functions.get(name, [])
    if len(defs) != 1:
        return None
    values: set[str] = set()
    for node in ast.walk(defs[0]):
        if isinstance(node, ast.Return) and node.value is not None:
            if isinstance(node.value, ast.Constant) and node.value.value is None:
                continue
            found = _strings(node.value, defs[0], None)
            if WILD in found:
                return None
            values |= found
    return values or None


def _strings(expr: ast.expr, scope: ast.AST, owner: ast.ClassDef | None) -> set[str]:
    """The strings ``expr`` can hold; ``*`` for a part the code does not spell out."""
    if isinstance(expr, ast.Constant):
        return {expr.value} if isinstance(expr.value, str) else set()
    if isinstance(expr, ast.IfExp):
        return _strings(expr.body, scope, owner) | _strings(expr.orelse, scope, owner)
    if isinstance(expr, ast.JoinedStr):
        parts = []
        for part in expr.values:
            if isinstance(part, ast.FormattedValue):
                parts.append(sorted(_strings(part.value, scope, owner) or {WILD}))
            else:
                parts.append(sorted(_strings(part, scope, owner)))
        return {"".join(p) for p in itertools.product(*parts)}
    if isinstance(expr, ast.Name):
        values = [_strings(v, scope, owner) for v in _assigned(expr.id, scope)]
        return set().union(*values) if values else {WILD}
    is_self = isinstance(expr, ast.Attribute) and ast.unparse(expr.value) == "self"
    if isinstance(expr, ast.Attribute) and is_self and owner is not None:
        return _attribute_values(owner, expr.attr) or {WILD}
    if isinstance(expr, ast.Call):
        func = expr.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return _returned(name) or {WILD}
    return {WILD}


def _is_logger(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in LOGGERS
    if isinstance(expr, ast.Attribute):
        return expr.attr in LOGGERS
    if isinstance(expr, ast.Call):
        func = expr.func
        return (isinstance(func, ast.Name) and func.id in MAKERS) or (
            isinstance(func, ast.Attribute) and func.attr in MAKERS
        )
    return False


def _method_levels(expr: ast.expr) -> set[str] | None:
    """``log.info`` (or ``log.info if c else log.warning``): its levels; None if not one."""
    if isinstance(expr, ast.IfExp):
        body, orelse = _method_levels(expr.body), _method_levels(expr.orelse)
        return None if body is None or orelse is None else body | orelse
    if isinstance(expr, ast.Attribute) and expr.attr in METHODS and _is_logger(expr.value):
        return {"error" if expr.attr == "exception" else expr.attr}
    return None


def _level_values(expr: ast.expr, scope: ast.AST) -> set[str]:
    """``logging.INFO``, a conditional of them, or a local bound to them."""
    if isinstance(expr, ast.IfExp):
        return _level_values(expr.body, scope) | _level_values(expr.orelse, scope)
    if isinstance(expr, ast.Attribute) and expr.attr in LEVELS:
        return {LEVELS[expr.attr]}
    if isinstance(expr, ast.Name):
        return set().union(*(_level_values(v, scope) for v in _assigned(expr.id, scope)))
    raise AssertionError(f"a log level the test cannot read: {ast.unparse(expr)}")


def _log_calls() -> Iterator[tuple[Call, set[str], ast.expr]]:
    """Each log call, with its levels and its name argument."""
    package = _package()
    for call in package.calls:
        node, func = call.node, call.node.func
        levels: set[str] | None = None
        if isinstance(func, ast.Attribute) and func.attr == "log" and _is_logger(func.value):
            if len(node.args) >= 2:
                yield call, _level_values(node.args[0], call.scope), node.args[1]
            continue
        if isinstance(func, ast.Name) and func.id in package.aliases:
            bound = [_method_levels(v) for v in _assigned(func.id, call.scope)]
            if bound and all(b is not None for b in bound):
                levels = set().union(*(b for b in bound if b is not None))
        elif isinstance(func, ast.Attribute):
            levels = _method_levels(func)
        if levels is not None and node.args:
            yield call, levels, node.args[0]


@cache
def code_events() -> dict[str, Event]:
    events: dict[str, Event] = defaultdict(Event)
    for call, levels, name in _log_calls():
        for event in _strings(name, call.scope, call.owner):
            found = events[event]
            found.levels |= levels
            found.fields |= {kw.arg for kw in call.node.keywords if kw.arg is not None}
            found.sites.append(f"{call.path.relative_to(REPO)}:{call.node.lineno}")
    return dict(events)


# --- the catalogue ----------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@cache
def doc_events() -> dict[str, Event]:
    """The rows of every table whose first column is ``Event``: names, levels, fields."""
    events: dict[str, Event] = defaultdict(Event)
    in_table = False
    for number, line in enumerate(CATALOGUE.read_text().splitlines(), start=1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = _cells(line)
        if cells[0] == "Event":
            in_table = True
            continue
        if not in_table or set(cells[0]) <= set("-: "):
            continue
        assert len(cells) == 4, f"docs/events.md:{number}: a row of 4 cells: {line}"
        names = re.findall(r"`([^`]+)`", cells[0])
        assert names, f"docs/events.md:{number}: no event name in {cells[0]!r}"
        for name in names:
            event = events[name]
            event.levels |= set(re.findall(r"\b(debug|info|warning|error)\b", cells[1]))
            event.fields |= set(re.findall(r"`([^`]+)`", cells[2]))
            event.sites.append(f"docs/events.md:{number}")
    return dict(events)


def _covers(documented: str, emitted: str) -> bool:
    """A row stands for an event: the same name, or one of them a pattern of the other."""
    return (
        documented == emitted
        or (WILD in documented and fnmatch.fnmatchcase(emitted, documented))
        or (WILD in emitted and fnmatch.fnmatchcase(documented, emitted))
    )


# --- the tests --------------------------------------------------------------------------
def test_the_code_has_events_and_the_catalogue_has_rows() -> None:
    assert len(code_events()) > 50
    assert len(doc_events()) > 50


def test_every_event_in_the_code_is_in_the_catalogue() -> None:
    missing = {
        name: event.sites
        for name, event in code_events().items()
        if not any(_covers(d, name) for d in doc_events())
    }
    assert not missing, f"not in docs/events.md: {missing}"


def test_every_event_in_the_catalogue_is_in_the_code() -> None:
    stale = {
        name: event.sites
        for name, event in doc_events().items()
        if not any(_covers(name, e) for e in code_events())
    }
    assert not stale, f"docs/events.md names events the code no longer emits: {stale}"


def test_the_catalogue_gives_each_event_its_levels_and_fields() -> None:
    wrong = []
    for name, event in code_events().items():
        rows = [d for n, d in doc_events().items() if _covers(n, name)]
        levels = set().union(*(d.levels for d in rows))
        fields = set().union(*(d.fields for d in rows))
        if rows and levels != event.levels:
            wrong.append(f"{name}: levels {sorted(levels)} in the doc, {sorted(event.levels)}")
        if rows and not event.fields <= fields:
            wrong.append(f"{name}: fields {sorted(event.fields - fields)} not in the doc")
    assert not wrong, "\n".join(wrong)


def _says_a_verb(name: str) -> bool:
    words = name.rpartition(".")[2].split("_")
    return any(w.endswith(("ed", "ing")) or w in VERB_WORDS for w in words) or words[-1] in STATES


def test_every_name_is_a_dotted_lower_case_verb() -> None:
    """A pattern (``site.*``) is checked with its ``*`` as a word; its verb is unknown."""
    names = set(code_events()) | set(doc_events())
    bad = {n for n in names if not DOTTED.fullmatch(n.replace(WILD, "any"))}
    assert not bad, f"not dotted lower-case words: {sorted(bad)}"
    no_verb = {n for n in names if WILD not in n and not _says_a_verb(n)}
    assert no_verb - NOT_VERBS == set(), "names that say no verb: name what happened"
    assert NOT_VERBS - no_verb == set(), "renamed: take these out of NOT_VERBS"
