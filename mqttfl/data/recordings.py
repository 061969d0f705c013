"""What every data source yields, and the one split policy applied to it.

A source reads and windows its data into a :class:`WindowTable`: every window's session
and label, and, where windows have a time order, the recording it was cut from. Sources
that read files build that table from :class:`Recording` s, one per sitting of one
capture. :func:`split_table` then decides the test windows once, the same way for every
source:

* windows the source holds out (``test_only``: ESPectre's ``test/`` recording) are the
  test set, and every other window trains, whatever the split;
* ``session``: whole sessions are test (:mod:`mqttfl.data.sessions`): label by label for
  recordings of one label each, the latest for sessions that are days recording every
  label (the synthetic rooms);
* ``window``: the last windows of each recording by time, none sharing a packet with a
  train window (:func:`~mqttfl.data.preprocess.split_starts_by_time`); windows with no
  time order (simulated ones) give a stratified random share instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from mqttfl.data.preprocess import split_starts_by_time
from mqttfl.data.sessions import held_out_sessions, latest_sessions
from mqttfl.errors import DataError

Split = Literal["window", "session"]
SPLITS: tuple[Split, ...] = get_args(Split)


def check_split(split: str, test_fraction: float | None = None) -> Split:
    """``split`` as a :data:`Split`, checked with the ``test_fraction`` it is given; a
    ValueError naming the choices or the problem otherwise."""
    for known in SPLITS:
        if split == known:
            if known == "session" and test_fraction is not None and test_fraction <= 0:
                raise ValueError("a session split needs a positive --test-fraction")
            return known
    raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


@dataclass(frozen=True)
class Recording:
    """One sitting of one capture, read and windowed by its source."""

    source: str  # where it came from (a file): named in messages and in the shard's meta
    session: str  # the session it was recorded in; recordings may share one
    label: int
    windows: np.ndarray  # (n, window, F) windows in time order, or (n, F) feature rows
    starts: np.ndarray  # the first packet of each window (a row's index, for rows)
    span: int  # packets per window (1 for rows)
    test_only: bool = False  # the source holds it out for testing


@dataclass(frozen=True)
class WindowTable:
    """Every window of one client, as the split policy sees it."""

    sessions: np.ndarray  # session id of each window (an index into session_names)
    labels: np.ndarray
    session_names: list[str]
    #: recording id of each window; None: the windows have no time order (simulated)
    recordings: np.ndarray | None = None
    starts: np.ndarray | None = None  # each window's first packet in its recording
    spans: Sequence[int] = ()  # packets per window, per recording
    test_only: np.ndarray | None = None  # windows the source holds out for testing
    #: sessions are days that each record every label, rather than recordings of one label
    sessions_are_days: bool = False


@dataclass(frozen=True)
class SplitIndices:
    """Which windows train and which test (ascending indices), and the test sessions."""

    train: np.ndarray
    test: np.ndarray
    held: list[int] = field(default_factory=list)  # session ids that are test sessions


def split_table(
    table: WindowTable,
    split: Split,
    test_fraction: float,
    *,
    rng: np.random.Generator | None = None,
    where: str = "the recordings",
    hint: str = "",
) -> SplitIndices:
    """The split policy (module docstring). ``rng`` draws the stratified share of windows
    with no time order; ``where`` and ``hint`` word the error of a session split that
    finds no session to hold out."""
    split = check_split(split, test_fraction)
    if table.test_only is not None and table.test_only.any():
        test_mask = table.test_only
        held = sorted({int(s) for s in np.unique(table.sessions[test_mask])})
        return SplitIndices(np.flatnonzero(~test_mask), np.flatnonzero(test_mask), held)
    if split == "session":
        if table.sessions_are_days:
            held = latest_sessions(table.sessions, test_fraction)
        else:
            held = held_out_sessions(table.sessions, table.labels, test_fraction)
        if not held:
            raise DataError(
                where,
                "a session split needs a label recorded in two sessions or more; the "
                f"sessions are {', '.join(table.session_names)}" + (f" ({hint})" if hint else ""),
            )
        is_test = np.isin(table.sessions, held)
        return SplitIndices(np.flatnonzero(~is_test), np.flatnonzero(is_test), held)
    if table.recordings is None:
        if rng is None:
            raise ValueError("windows with no time order need an rng for their split")
        return SplitIndices(*stratified_split(rng, table.labels, test_fraction))
    assert table.starts is not None
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for recording, span in enumerate(table.spans):
        rows = np.flatnonzero(table.recordings == recording)
        tr, te = split_starts_by_time(table.starts[rows], span, test_fraction)
        train.append(rows[tr])
        test.append(rows[te])
    return SplitIndices(np.concatenate(train), np.concatenate(test))


def stratified_split(
    rng: np.random.Generator, y: np.ndarray, test_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): every label contributes ~test_fraction to the test set.

    Samples are sorted by label (random order within a label) and the test set is
    an evenly spaced systematic sample of that order with a random offset.
    """
    n = len(y)
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    order = rng.permutation(n)
    order = order[np.argsort(y[order], kind="stable")]
    picks = ((np.arange(n_test) + rng.random()) * n / n_test).astype(np.int64)
    is_test = np.zeros(n, dtype=bool)
    is_test[order[picks]] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


@dataclass(frozen=True)
class SplitRecordings:
    """Recordings after the split: the train and test windows, labels and sessions, in
    recording order."""

    x_train: np.ndarray
    y_train: np.ndarray
    s_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    session_names: list[str]
    recording_sessions: list[int]  # each recording's session id
    held: list[int]
    counts: list[tuple[int, int]]  # each recording's (train, test) windows


def table_of(recordings: Sequence[Recording]) -> WindowTable:
    """The window table of recordings; sessions are numbered in order of first recording."""
    names: list[str] = []
    for rec in recordings:
        if rec.session not in names:
            names.append(rec.session)
    sizes = [len(rec.windows) for rec in recordings]

    def per_window(values: Sequence[int | bool], dtype: type) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=dtype), sizes)

    return WindowTable(
        sessions=per_window([names.index(rec.session) for rec in recordings], np.int64),
        labels=per_window([rec.label for rec in recordings], np.int64),
        session_names=names,
        recordings=per_window(list(range(len(recordings))), np.int64),
        starts=np.concatenate([np.asarray(rec.starts, dtype=np.int64) for rec in recordings]),
        spans=[rec.span for rec in recordings],
        test_only=per_window([rec.test_only for rec in recordings], bool),
    )


def split_recordings(
    recordings: Sequence[Recording],
    split: Split,
    test_fraction: float,
    *,
    where: str = "the recordings",
    hint: str = "",
) -> SplitRecordings:
    """:func:`split_table` over recordings, and the windows gathered on each side."""
    table = table_of(recordings)
    chosen = split_table(table, split, test_fraction, where=where, hint=hint)
    windows = np.concatenate([rec.windows for rec in recordings])
    assert table.recordings is not None
    # windows on neither side (train windows that straddle the first test one) count nowhere
    train_of = np.bincount(table.recordings[chosen.train], minlength=len(recordings))
    test_of = np.bincount(table.recordings[chosen.test], minlength=len(recordings))
    counts = [(int(a), int(b)) for a, b in zip(train_of, test_of, strict=True)]
    return SplitRecordings(
        x_train=windows[chosen.train],
        y_train=table.labels[chosen.train],
        s_train=table.sessions[chosen.train],
        x_test=windows[chosen.test],
        y_test=table.labels[chosen.test],
        s_test=table.sessions[chosen.test],
        session_names=table.session_names,
        recording_sessions=[table.session_names.index(rec.session) for rec in recordings],
        held=chosen.held,
        counts=counts,
    )
