"""The ESPectre presence federation: one client per ESP32 chip.

The ESPectre project's recordings (``espectre/`` under the data directory, GPLv3) come from five
ESP32 chips in one home: S3, C3, C5, C6 and the original ESP32.  Each chip has two
quiet-room recordings (``baseline/``, label 0 "quiet") and two with a person moving
(``movement/``, label 1), about 10 s each at 100-135 packets/s, 64 subcarriers of int8
interleaved I/Q.  Different chips (and dates) make the clients device-heterogeneous.

Client ``i`` is chip :data:`ESPECTRE_CHIPS` ``[i]``.  Preprocessing is the one of
:mod:`mqttfl.data.preprocess`: amplitude, null and pilot subcarriers removed (HT20
plan, 51 subcarriers on every chip), windows of ``window`` packets every ``stride``.

Split by time within each recording: the last ``test_fraction`` of each recording's
windows are test windows, and no train window shares a packet with a test window.
The C3 chip also has ``test/``: 30 s quiet, then movement from packet 3040 on
(``dataset_info.json``).  For C3 that recording is the held-out test set: its quiet
part [0, 3040) and its movement part [3040, end) are windowed separately, so no
window straddles the change, while all of C3's baseline/movement windows train.

The per-subcarrier normalisation (on by default) is fitted on the client's training
windows only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture import load_capture
from mqttfl.data.preprocess import (
    Normalizer,
    capture_features,
    gather_windows,
    split_windows_by_time,
    window_starts,
)
from mqttfl.data.sessions import SPLITS, held_out_sessions
from mqttfl.data.shard import Shard, read_json_file
from mqttfl.errors import ConfigError, DataError

ESPECTRE_CHIPS: tuple[str, ...] = ("c3", "c5", "c6", "esp32", "s3")
CLASSES: tuple[str, ...] = ("quiet", "movement")
_LABELS = {"baseline": 0, "movement": 1}
HELDOUT_CHIP = "c3"
# dataset_info.json: "Motion starts at packet index 3040 (~30.0 s)."
DEFAULT_MOTION_START = 3040


def _read_info(root: Path) -> dict[str, Any]:
    if not root.is_dir():
        raise DataError(
            root,
            "ESPectre data directory not found (expected baseline/, movement/, dataset_info.json)",
        )
    info_path = root / "dataset_info.json"
    info = read_json_file(info_path)
    if not isinstance(info, dict) or not isinstance(info.get("files"), dict):
        raise DataError(info_path, "expected an object with a 'files' table")
    return info


def espectre_recordings(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Recordings per chip: dicts with ``path``, ``kind`` (baseline/movement/test), ``packets``
    and, for test recordings, ``motion_start``."""
    root = Path(root)
    info = _read_info(root)
    info_path = root / "dataset_info.json"
    out: dict[str, list[dict[str, Any]]] = {chip: [] for chip in ESPECTRE_CHIPS}
    for kind, entries in info["files"].items():
        if kind not in ("baseline", "movement", "test") or not isinstance(entries, list):
            continue
        for entry in entries:
            try:
                name, chip = str(entry["filename"]), str(entry["chip"]).lower()
            except (TypeError, KeyError):
                raise DataError(info_path, f"a '{kind}' entry lacks filename or chip") from None
            if chip not in out:
                continue
            rec: dict[str, Any] = {
                "path": root / kind / name,
                "kind": kind,
                "packets": entry.get("num_packets"),
            }
            if kind == "test":
                m = re.search(r"starts at packet index (\d+)", str(entry.get("description", "")))
                rec["motion_start"] = int(m.group(1)) if m else DEFAULT_MOTION_START
            out[chip].append(rec)
    for chip in out:
        out[chip].sort(key=lambda r: (r["kind"], r["path"].name))
    return out


def espectre_shard(
    client_id: int,
    *,
    root: Path,
    window: int,
    stride: int | None = None,
    test_fraction: float = 0.2,
    normalize: bool = True,
    drop_pilots: bool = True,
    split: str = "window",
) -> Shard:
    """Shard of ESPectre client ``client_id`` (chip ``ESPECTRE_CHIPS[client_id]``).

    ``x`` is float32 (n, window, 51) amplitude windows, ``y`` 0 = quiet, 1 = movement.
    Raises :class:`DataError` naming the missing root, file or a too-short recording.
    ``split="session"``: every recording is a session, and whole recordings are held out
    (:func:`~mqttfl.data.sessions.held_out_sessions`: of a chip's two recordings per
    label, the later one); C3 keeps its ``test/`` recording as its test session.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not 0 <= int(client_id) < len(ESPECTRE_CHIPS):
        raise ConfigError(
            "client id", f"ESPectre has {len(ESPECTRE_CHIPS)} clients (0-4), got {client_id}"
        )
    if window < 1 or (stride is not None and stride < 1):
        raise ValueError("window and stride must be positive")
    root = Path(root)
    chip = ESPECTRE_CHIPS[int(client_id)]
    recordings = espectre_recordings(root)[chip]
    labelled = [r for r in recordings if r["kind"] in _LABELS]
    heldout = [r for r in recordings if r["kind"] == "test"] if chip == HELDOUT_CHIP else []
    if not {r["kind"] for r in labelled} >= set(_LABELS):
        raise DataError(
            root / "dataset_info.json", f"chip {chip} lacks baseline or movement recordings"
        )

    x_tr: list[np.ndarray] = []
    y_tr: list[np.ndarray] = []
    x_te: list[np.ndarray] = []
    y_te: list[np.ndarray] = []
    s_tr: list[np.ndarray] = []
    s_te: list[np.ndarray] = []
    # sessions: one per recording, in the order of their time stamps (file names)
    labelled.sort(key=lambda r: r["path"].name.split("_", 1)[-1])
    held: list[int] = []
    if split == "session" and not heldout:
        held = held_out_sessions(
            np.arange(len(labelled)),
            np.array([_LABELS[r["kind"]] for r in labelled]),
            test_fraction,
        )
    files: list[dict[str, Any]] = []
    selection = None

    def rows_of(rec: dict[str, Any]) -> np.ndarray:
        nonlocal selection
        path = rec["path"]
        if not path.is_file():
            raise DataError(path, "file listed in dataset_info.json not found")
        cap = load_capture(path, "npz")
        if cap.info.get("chip") not in (None, chip):
            raise DataError(
                path, f"holds chip {cap.info.get('chip')!r}, dataset_info.json says {chip!r}"
            )
        rows, sel = capture_features(cap, drop_pilots=drop_pilots)
        if selection is None:
            selection = sel
        elif sel.positions != selection.positions:
            raise DataError(path, "subcarrier layout differs from the chip's other recordings")
        if len(rows) < window:
            raise DataError(
                path, f"too few packets: {len(rows)} packets, fewer than one window of {window}"
            )
        return rows

    split_fraction = 0.0 if heldout or split == "session" else test_fraction
    for session, rec in enumerate(labelled):
        rows = rows_of(rec)
        label = _LABELS[rec["kind"]]
        train, test = split_windows_by_time(len(rows), window, stride, split_fraction)
        if session in held:
            train, test = test, train  # the whole recording is a test session
        x_tr.append(gather_windows(rows, train, window))
        x_te.append(gather_windows(rows, test, window))
        y_tr.append(np.full(len(train), label, dtype=np.int64))
        y_te.append(np.full(len(test), label, dtype=np.int64))
        s_tr.append(np.full(len(train), session, dtype=np.int64))
        s_te.append(np.full(len(test), session, dtype=np.int64))
        files.append(
            {
                "path": str(rec["path"]),
                "label": CLASSES[label],
                "packets": len(rows),
                "train": len(train),
                "test": len(test),
            }
        )
    for rec in heldout:
        rows = rows_of(rec)
        start = int(rec["motion_start"])
        if not 0 < start < len(rows):
            raise DataError(rec["path"], f"motion start {start} is outside the {len(rows)} packets")
        per_label: list[int] = []
        for label, (lo, hi) in enumerate(((0, start), (start, len(rows)))):
            starts = window_starts(hi - lo, window, stride) + lo
            x_te.append(gather_windows(rows, starts, window))
            y_te.append(np.full(len(starts), label, dtype=np.int64))
            s_te.append(np.full(len(starts), len(labelled), dtype=np.int64))
            per_label.append(len(starts))
        files.append(
            {
                "path": str(rec["path"]),
                "label": "quiet then movement",
                "packets": len(rows),
                "motion_start": start,
                "train": 0,
                "test": sum(per_label),
                "test_per_label": {"quiet": per_label[0], "movement": per_label[1]},
            }
        )

    x_train, y_train = np.concatenate(x_tr), np.concatenate(y_tr)
    x_test, y_test = np.concatenate(x_te), np.concatenate(y_te)
    sessions = [r["path"].stem for r in labelled] + [r["path"].stem for r in heldout]
    if len(x_train) == 0 or (test_fraction > 0 and len(x_test) == 0):
        raise DataError(
            root, f"chip {chip}: too few windows of {window} packets for a train/test split"
        )
    norm = None
    if normalize:
        norm = Normalizer.fit(x_train)
        x_train, x_test = norm.apply(x_train), norm.apply(x_test)
    assert selection is not None

    def label_counts(y: np.ndarray) -> dict[str, int]:
        return {CLASSES[i]: int((y == i).sum()) for i in range(len(CLASSES))}

    meta = {
        "kind": "csi-windows",
        "dataset": "espectre",
        "format": "npz",
        "device": f"esp32:{chip}",
        "chip": chip,
        "client_id": int(client_id),
        "num_clients": len(ESPECTRE_CHIPS),
        "classes": list(CLASSES),
        "window": window,
        "stride": window if stride is None else stride,
        "subcarriers": selection.to_meta(),
        "source_files": [f["path"] for f in files],
        "files": files,
        "label_counts": {"train": label_counts(y_train), "test": label_counts(y_test)},
        "ordinal": False,
        "sessions": sessions,
        "split": _split_meta(split, heldout, held, sessions, test_fraction)
        if split == "session"
        else {
            "method": "held-out test recording" if heldout else "time",
            "test_fraction": 0.0 if heldout else test_fraction,
            "detail": (
                "train: all baseline/movement windows; test: the test/ recording, "
                "windowed separately before and after the motion start"
            )
            if heldout
            else "the last windows of each recording are test; none shares a packet with train",
        },
        "normalization": None
        if norm is None
        else {"kind": "per-feature z-score fitted on train", **norm.to_dict()},
        "license": "GPL-3.0 (ESPectre data)",
    }
    return Shard(
        x_train=x_train.astype(np.float32),
        y_train=y_train,
        x_test=x_test.astype(np.float32),
        y_test=y_test,
        meta=meta,
        s_train=np.concatenate(s_tr),
        s_test=np.concatenate(s_te),
    )


def _split_meta(
    split: str, heldout: list[dict[str, Any]], held: list[int], sessions: list[str], fraction: float
) -> dict[str, Any]:
    test = [sessions[i] for i in held] if not heldout else sessions[len(sessions) - 1 :]
    return {
        "method": "session",
        "test_fraction": fraction,
        "test_sessions": test,
        "train_sessions": [name for name in sessions if name not in test],
        "detail": "every recording is a session; whole recordings are held out for testing "
        + ("(the test/ recording)" if heldout else "(per label, the later of the chip's two)"),
    }
