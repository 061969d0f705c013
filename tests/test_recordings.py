"""The one split policy (mqttfl/data/recordings.py) on hand-made recordings."""

from __future__ import annotations

import numpy as np
import pytest

from mqttfl.data.recordings import (
    Recording,
    WindowTable,
    check_split,
    split_recordings,
    split_table,
)
from mqttfl.errors import DataError


def _recording(
    session: str, label: int, starts: list[int], *, test_only: bool = False
) -> Recording:
    windows = np.arange(len(starts), dtype=np.float32).reshape(-1, 1) + 10 * label
    return Recording(f"{session}.dat", session, label, windows, np.array(starts), 4, test_only)


def test_the_window_split_takes_each_recordings_last_windows_and_drops_the_straddler() -> None:
    # starts 0,2,4,6,8 with span 4: the last window (8) is test; 6 ends at 10 > 8: dropped
    a = _recording("a", 0, [0, 2, 4, 6, 8])
    b = _recording("b", 1, [0, 4])
    parts = split_recordings([a, b], "window", 0.2)
    assert parts.counts == [(3, 1), (1, 1)]
    assert parts.x_train.ravel().tolist() == [0, 1, 2, 10]
    assert parts.x_test.ravel().tolist() == [4, 11]
    assert parts.s_train.tolist() == [0, 0, 0, 1]
    assert parts.held == []


def test_the_session_split_holds_out_whole_sessions_label_by_label() -> None:
    recs = [_recording("d1", 0, [0]), _recording("d2", 0, [0, 4]), _recording("d1", 1, [0])]
    parts = split_recordings(recs, "session", 0.2)
    assert parts.session_names == ["d1", "d2"]
    assert parts.held == [1]  # label 0's later session; label 1 has one session only
    assert parts.counts == [(1, 0), (0, 2), (1, 0)]
    assert parts.s_test.tolist() == [1, 1]


def test_held_out_recordings_are_the_test_set_whatever_the_split() -> None:
    recs = [_recording("a", 0, [0, 4, 8]), _recording("t", 1, [0, 4], test_only=True)]
    for split in ("window", "session"):
        parts = split_recordings(recs, check_split(split), 0.2)
        assert parts.counts == [(3, 0), (0, 2)]
        assert parts.held == [1]


def test_days_hold_out_the_latest_and_unordered_windows_a_stratified_share() -> None:
    sessions = np.array([0, 1, 2, 0, 1, 2])
    labels = np.array([0, 0, 0, 1, 1, 1])
    days = WindowTable(sessions, labels, ["d0", "d1", "d2"], sessions_are_days=True)
    chosen = split_table(days, "session", 0.2)
    assert chosen.held == [2]
    assert chosen.test.tolist() == [2, 5]
    chosen = split_table(days, "window", 1 / 3, rng=np.random.default_rng(0))
    assert sorted(labels[chosen.test].tolist()) == [0, 1]  # one of each label


def test_a_session_split_with_nothing_to_hold_out_says_so_in_one_line() -> None:
    with pytest.raises(DataError, match=r"two sessions or more; the sessions are a \(use more\)"):
        split_recordings(
            [_recording("a", 0, [0, 4])], "session", 0.2, where="a.dat", hint="use more"
        )
    with pytest.raises(ValueError, match="positive --test-fraction"):
        check_split("session", 0.0)
    with pytest.raises(ValueError, match="window, session"):
        check_split("day")
