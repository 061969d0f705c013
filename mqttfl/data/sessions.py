"""The session split: test windows come from recording sessions a client never trained on.

A recording session is one sitting of a capture: a crowd layout of the synthetic rooms,
one ESPectre recording, one input file (or a regex group of file names) of
``data prepare``. Windows of one session share its fingerprint (where people sit, where
the chairs and doors are, the receiver's gain), so a test split taken from the sessions
a client trained on (the window split the papers use) rewards learning that
fingerprint. The session split holds whole sessions out instead, as a deployed sensor
faces them: recorded on some days, used on others.

:func:`split_by_session` picks the test sessions label by label (sessions that are
recordings of one label each, as input files usually are), or, for sessions that are
days recording every label (the synthetic rooms), the latest days. Label by label: a label recorded in
``n >= 2`` sessions gets ``max(1, round(test_fraction * n))`` of them as test (at most
``n - 1``), taken from the end of the session order (the latest recordings); a session
picked for one label is a test session for every label in it. A label recorded in one
session only stays in training. No session is in both splits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mqttfl.errors import DataError


def held_out_sessions(sessions: np.ndarray, y: np.ndarray, test_fraction: float) -> list[int]:
    """The session ids held out for testing (sorted); see the module docstring."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    held: set[int] = set()
    for label in np.unique(y):
        have = [int(s) for s in np.unique(sessions[y == label])]
        if len(have) < 2:
            continue
        target = min(len(have) - 1, max(1, round(test_fraction * len(have))))
        for session in reversed(have):
            if len(held.intersection(have)) >= target:
                break
            held.add(session)
    return sorted(held)


def latest_sessions(sessions: np.ndarray, test_fraction: float) -> list[int]:
    """The latest ``max(1, round(test_fraction * n))`` of ``n >= 2`` sessions (at most
    ``n - 1``): for sessions that are days, each recording every label (the synthetic
    rooms), the days a room is used on after it was recorded."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    have = [int(s) for s in np.unique(sessions)]
    if len(have) < 2:
        return []
    return have[-min(len(have) - 1, max(1, round(test_fraction * len(have)))) :]


def split_by_session(
    sessions: np.ndarray, y: np.ndarray, test_fraction: float, *, by_label: bool = True
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Indices (train, test) of a session split, and the test session ids: chosen label
    by label (:func:`held_out_sessions`), or (``by_label=False``) the latest sessions
    (:func:`latest_sessions`)."""
    sessions = np.asarray(sessions, dtype=np.int64)
    y = np.asarray(y)
    if sessions.shape != y.shape:
        raise ValueError(f"{sessions.shape[0]} session ids for {y.shape[0]} labels")
    if by_label:
        held = held_out_sessions(sessions, y, test_fraction)
    else:
        held = latest_sessions(sessions, test_fraction)
    is_test = np.isin(sessions, held)
    return np.flatnonzero(~is_test), np.flatnonzero(is_test), held


def sessions_per_label(
    sessions: np.ndarray, y: np.ndarray, names: Sequence[str] | None = None
) -> dict[str, list[str]]:
    """``{label: [session, ...]}``: the sessions each label was recorded in."""
    out: dict[str, list[str]] = {}
    for label in np.unique(y):
        ids = np.unique(sessions[y == label])
        out[str(int(label))] = [
            names[int(s)] if names and 0 <= int(s) < len(names) else str(int(s)) for s in ids
        ]
    return out


def split_meta(
    sessions: np.ndarray,
    y: np.ndarray,
    held: Sequence[int],
    names: Sequence[str],
    test_fraction: float,
) -> dict[str, object]:
    """The shard meta's ``split`` entry of a session split (``sessions``/``y``: every
    window's, or every recording's, session and label)."""
    tested = np.isin(sessions, list(held))
    train_labels = {int(v) for v in np.unique(y[~tested])}
    test_labels = {int(v) for v in np.unique(y[tested])}
    return {
        "method": "session",
        "test_fraction": test_fraction,
        "test_sessions": [names[s] for s in held],
        "train_sessions": [names[s] for s in range(len(names)) if s not in held],
        "train_only_labels": sorted(train_labels - test_labels),
        "test_only_labels": sorted(test_labels - train_labels),
        "detail": "whole sessions are held out: no test window comes from a session the "
        "client trained on",
    }


def session_function(spec: str) -> Callable[[Path], str]:
    """``file``: a session per input file; ``regex:PATTERN``: the named group ``session``
    (else group 1, else the whole match) of the pattern searched in the path, so files
    of one day or one folder form one session."""
    if spec == "file":
        return lambda path: str(path)
    if not spec.startswith("regex:"):
        raise ValueError(f"--session must be 'file' or 'regex:PATTERN', got {spec!r}")
    pattern = spec[len("regex:") :]
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad session pattern {pattern!r}: {exc}") from None

    def session(path: Path) -> str:
        match = regex.search(path.as_posix())
        if match is None:
            raise DataError(path, f"session pattern {pattern!r} does not match the path")
        if "session" in regex.groupindex:
            value = match.group("session")
        else:
            value = match.group(1) if regex.groups else match.group(0)
        if not value:
            raise DataError(path, f"session pattern {pattern!r} matched an empty session")
        return str(value)

    return session
