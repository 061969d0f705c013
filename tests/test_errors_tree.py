"""The error tree: every exception class defined under ``mqttfl/``
descends from :class:`~mqttfl.errors.MqttflError`, and every raise names a subclass that
says what kind of failure it is, never the base itself."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest

from mqttfl import errors
from mqttfl.errors import MqttflError

PACKAGE = Path(errors.__file__).resolve().parent


def modules() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return found


def base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def exception_classes() -> list[tuple[str, str]]:
    """(module, class) of every class whose bases lead to an exception, by name: a
    builtin exception, a name ending in Error or Exception, or another such class here."""
    classes = {
        (module, node.name): [base_name(b) for b in node.bases]
        for module, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    by_name: dict[str, list[str]] = {}
    for (_, name), bases in classes.items():
        by_name.setdefault(name, []).extend(bases)

    def raises(name: str, seen: frozenset[str] = frozenset()) -> bool:
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True
        if name.endswith(("Error", "Exception")):
            return True
        if name in seen or name not in by_name:
            return False
        return any(raises(base, seen | {name}) for base in by_name[name])

    return sorted(key for key, bases in classes.items() if any(map(raises, bases)))


def test_the_walk_finds_the_exception_classes_it_must_judge() -> None:
    found = exception_classes()
    assert ("mqttfl.errors", "UsageError") in found
    assert ("mqttfl.bus.refusal", "Refused") in found
    assert ("mqttfl.bus.transport", "ClosedBeforeConnack") in found
    assert ("mqttfl.training.normstats", "_Reached") in found


@pytest.mark.parametrize(("module", "name"), exception_classes())
def test_every_exception_class_descends_from_mqttfl_error(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, MqttflError), f"{module}.{name} bases {cls.__mro__[1:]}"


def test_no_raise_names_the_base_error_itself() -> None:
    bare = []
    for module, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if base_name(raised) == "MqttflError":
                bare.append(f"{module}:{node.lineno}")
    assert bare == []


def test_the_tree_in_the_docstring_names_every_error_class() -> None:
    assert errors.__doc__ is not None
    defined = [
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, MqttflError)
    ]
    for name in defined:
        assert name in errors.__doc__, name
