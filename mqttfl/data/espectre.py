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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture import load_capture
from mqttfl.data.preprocess import (
    Normalizer,
    SubcarrierSelection,
    capture_features,
    gather_windows,
    window_starts,
)
from mqttfl.data.recordings import (
    Recording,
    Split,
    SplitRecordings,
    check_split,
    split_recordings,
)
from mqttfl.data.shard import Shard, read_json_file
from mqttfl.errors import ConfigError, DataError

ESPECTRE_CHIPS: tuple[str, ...] = ("c3", "c5", "c6", "esp32", "s3")
CLASSES: tuple[str, ...] = ("quiet", "movement")
_LABELS = {"baseline": 0, "movement": 1}
HELDOUT_CHIP = "c3"
# dataset_info.json: "Motion starts at packet index 3040 (~30.0 s)."
DEFAULT_MOTION_START = 3040


@dataclass(frozen=True)
class EspectreFile:
    """One recording listed in ``dataset_info.json``."""

    path: Path
    kind: str  # baseline, movement or test
    packets: int | None
    motion_start: int | None = None  # test recordings: the packet the movement starts at


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


def espectre_recordings(root: Path) -> dict[str, list[EspectreFile]]:
    """The files listed for each chip, sorted by kind and name."""
    root = Path(root)
    info = _read_info(root)
    info_path = root / "dataset_info.json"
    out: dict[str, list[EspectreFile]] = {chip: [] for chip in ESPECTRE_CHIPS}
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
            motion_start = None
            if kind == "test":
                m = re.search(r"starts at packet index (\d+)", str(entry.get("description", "")))
                motion_start = int(m.group(1)) if m else DEFAULT_MOTION_START
            packets = entry.get("num_packets")
            out[chip].append(EspectreFile(root / kind / name, kind, packets, motion_start))
    for chip in out:
        out[chip].sort(key=lambda r: (r.kind, r.path.name))
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
    split: Split = "window",
) -> Shard:
    """Shard of ESPectre client ``client_id`` (chip ``ESPECTRE_CHIPS[client_id]``).

    ``x`` is float32 (n, window, 51) amplitude windows, ``y`` 0 = quiet, 1 = movement.
    Raises :class:`DataError` naming the missing root, file or a too-short recording.
    ``split="session"``: every recording is a session, and whole recordings are held out
    (:func:`~mqttfl.data.sessions.held_out_sessions`: of a chip's two recordings per
    label, the later one); C3 keeps its ``test/`` recording as its test session.
    """
    split = check_split(split)
    if not 0 <= int(client_id) < len(ESPECTRE_CHIPS):
        raise ConfigError(
            "client id", f"ESPectre has {len(ESPECTRE_CHIPS)} clients (0-4), got {client_id}"
        )
    if window < 1 or (stride is not None and stride < 1):
        raise ValueError("window and stride must be positive")
    root = Path(root)
    chip = ESPECTRE_CHIPS[int(client_id)]
    reader = _ChipReader(chip, window, stride, drop_pilots)
    listed = espectre_recordings(root)[chip]
    labelled = [r for r in listed if r.kind in _LABELS]
    heldout = [r for r in listed if r.kind == "test"] if chip == HELDOUT_CHIP else []
    if not {r.kind for r in labelled} >= set(_LABELS):
        raise DataError(
            root / "dataset_info.json", f"chip {chip} lacks baseline or movement recordings"
        )
    # sessions: one per recording, in the order of their time stamps (file names)
    labelled.sort(key=lambda r: r.path.name.split("_", 1)[-1])
    recordings = [reader.labelled(r) for r in labelled]
    recordings += [part for r in heldout for part in reader.heldout(r)]
    parts = split_recordings(recordings, split, test_fraction)
    if len(parts.x_train) == 0 or (test_fraction > 0 and len(parts.x_test) == 0):
        raise DataError(
            root, f"chip {chip}: too few windows of {window} packets for a train/test split"
        )
    x_train, x_test = parts.x_train, parts.x_test
    norm = None
    if normalize:
        norm = Normalizer.fit(x_train)
        x_train, x_test = norm.apply(x_train), norm.apply(x_test)
    assert reader.selection is not None
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
        "subcarriers": reader.selection.to_meta(),
        **_files_meta(recordings, parts, reader),
        "sessions": parts.session_names,
        "split": _split_meta(split, heldout, parts, test_fraction),
        "normalization": None
        if norm is None
        else {"kind": "per-feature z-score fitted on train", **norm.to_dict()},
        "license": "GPL-3.0 (ESPectre data)",
    }
    return Shard(
        x_train=x_train.astype(np.float32),
        y_train=parts.y_train,
        x_test=x_test.astype(np.float32),
        y_test=parts.y_test,
        meta=meta,
        s_train=parts.s_train,
        s_test=parts.s_test,
    )


class _ChipReader:
    """Reads one chip's files into windowed recordings, checking that they agree."""

    def __init__(self, chip: str, window: int, stride: int | None, drop_pilots: bool) -> None:
        self.chip, self.window, self.stride, self.drop_pilots = chip, window, stride, drop_pilots
        self.selection: SubcarrierSelection | None = None
        self.packets: dict[str, int] = {}  # packets per file read
        self.motion_starts: dict[str, int] = {}  # the test recording's

    def rows(self, listed: EspectreFile) -> np.ndarray:
        path = listed.path
        if not path.is_file():
            raise DataError(path, "file listed in dataset_info.json not found")
        cap = load_capture(path, "npz")
        if cap.info.get("chip") not in (None, self.chip):
            raise DataError(
                path, f"holds chip {cap.info.get('chip')!r}, dataset_info.json says {self.chip!r}"
            )
        rows, sel = capture_features(cap, drop_pilots=self.drop_pilots)
        if self.selection is None:
            self.selection = sel
        elif sel.positions != self.selection.positions:
            raise DataError(path, "subcarrier layout differs from the chip's other recordings")
        if len(rows) < self.window:
            raise DataError(
                path,
                f"too few packets: {len(rows)} packets, fewer than one window of {self.window}",
            )
        self.packets[str(path)] = len(rows)
        return rows

    def _recording(
        self, listed: EspectreFile, rows: np.ndarray, label: int, lo: int, hi: int, test: bool
    ) -> Recording:
        starts = window_starts(hi - lo, self.window, self.stride) + lo
        windows = gather_windows(rows, starts, self.window)
        return Recording(
            str(listed.path), listed.path.stem, label, windows, starts, self.window, test
        )

    def labelled(self, listed: EspectreFile) -> Recording:
        rows = self.rows(listed)
        return self._recording(listed, rows, _LABELS[listed.kind], 0, len(rows), False)

    def heldout(self, listed: EspectreFile) -> list[Recording]:
        """The test recording, quiet before its motion start and movement after, each
        windowed on its own so that no window straddles the change."""
        rows = self.rows(listed)
        start = int(listed.motion_start or DEFAULT_MOTION_START)
        if not 0 < start < len(rows):
            raise DataError(listed.path, f"motion start {start} is outside the {len(rows)} packets")
        self.motion_starts[str(listed.path)] = start
        return [
            self._recording(listed, rows, 0, 0, start, True),
            self._recording(listed, rows, 1, start, len(rows), True),
        ]


def _files_meta(
    recordings: list[Recording], parts: SplitRecordings, reader: _ChipReader
) -> dict[str, object]:
    """The meta's ``files``, ``source_files`` and ``label_counts``: the test recording's
    two parts are one file."""
    files: dict[str, dict[str, Any]] = {}
    for rec, (train, test) in zip(recordings, parts.counts, strict=True):
        if not rec.test_only:
            files[rec.source] = {
                "path": rec.source,
                "label": CLASSES[rec.label],
                "packets": reader.packets[rec.source],
                "train": train,
                "test": test,
            }
            continue
        entry = files.setdefault(
            rec.source,
            {
                "path": rec.source,
                "label": "quiet then movement",
                "packets": reader.packets[rec.source],
                "motion_start": reader.motion_starts[rec.source],
                "train": 0,
                "test": 0,
                "test_per_label": {},
            },
        )
        entry["test"] += test
        entry["test_per_label"][CLASSES[rec.label]] = test

    def label_counts(y: np.ndarray) -> dict[str, int]:
        return {CLASSES[i]: int((y == i).sum()) for i in range(len(CLASSES))}

    return {
        "source_files": list(files),
        "files": list(files.values()),
        "label_counts": {"train": label_counts(parts.y_train), "test": label_counts(parts.y_test)},
        "ordinal": False,
    }


def _split_meta(
    split: Split, heldout: list[EspectreFile], parts: SplitRecordings, fraction: float
) -> dict[str, object]:
    if split == "window":
        return {
            "method": "held-out test recording" if heldout else "time",
            "test_fraction": 0.0 if heldout else fraction,
            "detail": (
                "train: all baseline/movement windows; test: the test/ recording, "
                "windowed separately before and after the motion start"
            )
            if heldout
            else "the last windows of each recording are test; none shares a packet with train",
        }
    sessions = parts.session_names
    test = [sessions[i] for i in parts.held]
    return {
        "method": "session",
        "test_fraction": fraction,
        "test_sessions": test,
        "train_sessions": [name for name in sessions if name not in test],
        "detail": "every recording is a session; whole recordings are held out for testing "
        + ("(the test/ recording)" if heldout else "(per label, the later of the chip's two)"),
    }
