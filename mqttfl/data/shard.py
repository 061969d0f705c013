"""One client's local dataset: train/test arrays plus JSON metadata.

FedAPA (Sec. V-D) evaluates each client on its own local split (80 % train,
20 % test), so a shard always carries both halves.  On disk a shard is a directory
holding ``shard.npz`` (plain arrays, no pickle) and ``meta.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.errors import DataError

ARRAYS_FILE = "shard.npz"
META_FILE = "meta.json"
_ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")
#: optional: each window's recording session (an index into meta["sessions"])
_SESSION_KEYS = ("s_train", "s_test")


def _problem(x_train: Any, y_train: Any, x_test: Any, y_test: Any, meta: Any) -> str | None:
    """Describe the first inconsistency among the shard parts, or None if valid."""
    for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            return f"x_{name}/y_{name} must be numpy arrays"
        if x.dtype != np.float32:
            return f"x_{name} must be float32, got {x.dtype}"
        if y.dtype != np.int64:
            return f"y_{name} must be int64, got {y.dtype}"
        if x.ndim not in (2, 3):
            return f"x_{name} must be (n, T, S) or (n, F), got shape {x.shape}"
        if y.ndim != 1:
            return f"y_{name} must be 1-D, got shape {y.shape}"
        if len(x) != len(y):
            return f"x_{name} has {len(x)} samples but y_{name} has {len(y)}"
        if not np.isfinite(x).all():
            return f"x_{name} contains NaN or inf"
        if y.size and y.min() < 0:
            return f"y_{name} contains negative labels"
    if x_train.shape[1:] != x_test.shape[1:]:
        return f"train samples {x_train.shape[1:]} and test samples {x_test.shape[1:]} differ"
    if not isinstance(meta, dict):
        return "meta must be a dict"
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        return f"meta is not JSON-serialisable: {exc}"
    return None


@dataclass(frozen=True, eq=False)
class Shard:
    """A client's local train/test split.

    ``x_*`` are float32, either (n, T, S) CSI amplitude windows (time x subcarrier)
    or (n, F) feature vectors; ``y_*`` are int64 class labels (people counts).
    ``meta`` is JSON-serialisable (source, device, window, subcarriers, ...).
    ``s_*`` (optional, both or neither) are int64 session ids per window, indices into
    ``meta["sessions"]`` (the recording each window was cut from).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    meta: dict[str, Any]
    s_train: np.ndarray | None = None
    s_test: np.ndarray | None = None

    def __post_init__(self) -> None:
        problem = _problem(self.x_train, self.y_train, self.x_test, self.y_test, self.meta)
        problem = problem or _session_problem(self)
        if problem is not None:
            raise DataError("<memory>", problem)

    @property
    def has_sessions(self) -> bool:
        return self.s_train is not None and self.s_test is not None

    @property
    def session_names(self) -> list[str]:
        names = self.meta.get("sessions")
        return [str(n) for n in names] if isinstance(names, list) else []

    @property
    def ordinal(self) -> bool:
        """Whether labels are counts (ordered, so an MAE means something): the meta's
        ``ordinal``, False when it does not say."""
        return self.meta.get("ordinal") is True

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample, (T, S) or (F,)."""
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def classes_present(self) -> np.ndarray:
        """Sorted distinct training labels (the client's class set C_i, Eq. 4)."""
        return np.unique(self.y_train)

    @property
    def label_counts(self) -> dict[int, int]:
        """Training samples per label, |D_{i,c}| in Eq. 4."""
        labels, counts = np.unique(self.y_train, return_counts=True)
        return {int(c): int(n) for c, n in zip(labels, counts, strict=True)}


def _session_problem(shard: Shard) -> str | None:
    if (shard.s_train is None) != (shard.s_test is None):
        return "s_train and s_test go together"
    if shard.s_train is None or shard.s_test is None:
        return None
    names = shard.meta.get("sessions")
    count = len(names) if isinstance(names, list) else 0
    for name, s, y in (
        ("train", shard.s_train, shard.y_train),
        ("test", shard.s_test, shard.y_test),
    ):
        if not isinstance(s, np.ndarray) or s.dtype != np.int64 or s.shape != y.shape:
            return f"s_{name} must be int64 with one session id per sample"
        if s.size and (s.min() < 0 or s.max() >= count):
            return f"s_{name} holds a session id outside meta['sessions'] ({count} sessions)"
    return None


def _write_arrays(shard: Shard, path: Path) -> None:
    keys = _ARRAY_KEYS + (_SESSION_KEYS if shard.has_sessions else ())
    with open(path, "wb") as fh:
        np.savez(fh, **{key: getattr(shard, key) for key in keys})
        fh.flush()
        os.fsync(fh.fileno())


def _write_meta(shard: Shard, path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(shard.meta, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def replace_directory(directory: Path, write: Callable[[Path], None]) -> None:
    """Fill a temporary sibling with ``write(tmp)``, then rename it to ``directory``.

    A crash never leaves a half-written directory, and an existing one is replaced only
    once the new one is complete (and put back if the swap fails).  Raises
    :class:`DataError` naming ``directory`` if it cannot be written.
    """
    directory = Path(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    except OSError as exc:
        raise DataError(directory, f"cannot create the directory: {exc.strerror or exc}") from None
    old: Path | None = None
    try:
        write(tmp)
        if directory.exists():
            # rename() cannot replace a non-empty directory; move the old one aside first
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
            os.rmdir(old)
            os.rename(directory, old)
        os.rename(tmp, directory)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not directory.exists():
            os.rename(old, directory)  # put the previous one back
        if isinstance(exc, OSError):
            raise DataError(directory, f"cannot write: {exc.strerror or exc}") from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_shard(shard: Shard, directory: Path) -> None:
    """Write ``directory/shard.npz`` and ``directory/meta.json`` atomically (an existing
    shard at ``directory`` is replaced)."""

    def write(tmp: Path) -> None:
        _write_arrays(shard, tmp / ARRAYS_FILE)
        _write_meta(shard, tmp / META_FILE)

    replace_directory(Path(directory), write)


def read_json_file(path: Path) -> Any:
    """Parse a JSON file; a missing or unreadable one is a DataError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(path, "file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(path, f"unreadable JSON: {exc}") from None


def _read_meta(path: Path) -> dict[str, object]:
    meta = read_json_file(path)
    if not isinstance(meta, dict):
        raise DataError(path, "expected a JSON object")
    return meta


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(path, "file not found")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [key for key in _ARRAY_KEYS if key not in npz.files]
            if missing:
                raise DataError(path, f"missing arrays: {', '.join(missing)}")
            present = [key for key in _SESSION_KEYS if key in npz.files]
            return {key: npz[key] for key in (*_ARRAY_KEYS, *present)}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise DataError(path, f"corrupt npz: {exc}") from None


def load_shard(directory: Path) -> Shard:
    """Read a shard written by :func:`save_shard`.

    Raises ``DataError`` naming the offending path if the directory or a file is
    missing, unreadable, or the arrays are inconsistent (dtype, lengths, NaN).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(directory, "shard directory not found")
    arrays = _read_arrays(directory / ARRAYS_FILE)
    meta = _read_meta(directory / META_FILE)
    problem = _problem(
        arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], meta
    )
    if problem is not None:
        raise DataError(directory / ARRAYS_FILE, problem)
    try:
        return Shard(**arrays, meta=meta)
    except DataError as exc:  # the session ids
        raise DataError(directory / ARRAYS_FILE, str(exc).removeprefix("<memory>: ")) from None
