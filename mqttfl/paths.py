"""Output directories named on the command line: checked before anything is written
(or, for a run that starts afresh in one, before it is set aside).

A path the user cannot write to (a regular file in the way, a read-only parent) is a
user error, reported as one line that names the path, never as an ``OSError`` traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from mqttfl.errors import FileError


def creation_problem(path: Path) -> str | None:
    """Why ``path`` cannot be created (or written into) as a directory, or None."""
    ancestor = Path(os.path.abspath(path))
    try:
        while not ancestor.exists() and ancestor.parent != ancestor:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{ancestor} is not a directory"
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None


def make_dir(path: Path, *, what: str) -> Path:
    """Create the directory ``path`` (and its parents) to write into; return it.

    Raises :class:`MqttflError` naming ``what`` (``--out``) and the path if it cannot be
    created or written into.
    """
    problem = creation_problem(path)
    if problem is None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if problem is not None:
        raise FileError(f"{what} {path}: cannot create the directory: {problem}")
    return path


def check_set_aside(path: Path, *, what: str) -> None:
    """Raise :class:`FileError` naming ``what`` unless the directory ``path`` could be
    renamed beside itself (:func:`mqttfl.files.set_aside_dir`): its parent is writable,
    and it is not (nor does it hold) the working directory, which would move with it."""
    here = Path(os.path.abspath(path))
    cwd = Path.cwd()
    if here == cwd or here in cwd.parents:
        raise FileError(
            f"{what} {path}: the directory you are in (or one holding it) cannot be set "
            "aside; name the run directory from outside it"
        )
    if not here.exists():
        return
    if not here.is_dir():
        raise FileError(f"{what} {path}: not a directory")
    if not os.access(here.parent, os.W_OK | os.X_OK):
        raise FileError(f"{what} {path}: cannot set it aside: {here.parent} is not writable")
