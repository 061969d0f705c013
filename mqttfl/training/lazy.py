"""Torch on first use: the coordinator, the wire and the CLI never load it.

Method modules hold their server side (numpy) and client side (torch) together; they
refer to torch through :func:`lazy_import`, so importing a method for its server side
costs nothing, and the first client-side call loads torch. ``sys.modules`` gains torch
only then (a test checks the torch-free imports).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

__all__ = ["F", "lazy_import", "nn", "no_grad", "torch"]

P = ParamSpec("P")
R = TypeVar("R")


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_import(name: str) -> Any:
    """A stand-in for ``import name`` that imports on the first attribute access."""
    return _LazyModule(name)


def no_grad(fn: Callable[P, R]) -> Callable[P, R]:
    """``@torch.no_grad()`` without importing torch when the function is defined."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper


# The one place torch is imported for the package's modules: ``from mqttfl.training.lazy
# import F, nn, torch`` (type checkers see the modules themselves).
if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
else:
    torch = lazy_import("torch")
    nn = lazy_import("torch.nn")
    F = lazy_import("torch.nn.functional")
