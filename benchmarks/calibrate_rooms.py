"""Calibrate the simulated rooms with Local only: the figures a simulator setting gives,
none of which depends on a federated method.

For one setting of the simulator's within-session knobs (how far people move between
windows, how many walk, how far walkers roam), on the default job's six rooms
(configs/fedapa-csi.toml) under the papers' split (each client's own stratified 80/20):

- ``local``: Local's mean client accuracy and MAE (people), scored on a validation split
  (20 % of each client's training windows, :func:`mqttfl.data.sources.validation_shard`);
  the test split is never read. Target: the paper's Local row (Table III, 72.06 %,
  MAE 0.69).
- ``within``: per recording session and label, the coefficient of variation of the
  windows' mean amplitude (median over clients), the simulator's side of ESPectre's
  per-recording figure (a recording there is one session of one label). Target: the
  ESPectre figure of the same function, printed beside it.
- ``between``: the between-session figures already matched (the sessions' CV of the mean
  amplitude per label); they must stay where they are.

    python -m benchmarks.calibrate_rooms                      # the shipped setting
    python -m benchmarks.calibrate_rooms roam=0.1 walk=0.5    # a candidate
    python -m benchmarks.calibrate_rooms rounds=45 train.lr=0.05  # another budget or recipe
    python -m benchmarks.calibrate_rooms --real               # ESPectre's figures

Knobs (module constants of :mod:`mqttfl.data.synthetic`, set for this process only):
``shift`` (_SHIFT_M), ``sway`` (_SWAY_M), ``roam`` (_ROAM_M), ``walk`` (a factor on
every room's walking probability), ``speed`` (walkers' top speed, m/s), ``level``
(WINDOW_LEVEL_SIGMA, the gain's wobble per window), ``day`` (SESSION_LEVEL_SIGMA, the
gain a recording day holds).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from benchmarks.common import log

KNOBS = {"shift": "_SHIFT_M", "sway": "_SWAY_M", "roam": "_ROAM_M"}
TARGETS = {"local_accuracy": 72.06, "local_mae": 0.69}


def set_knobs(knobs: dict[str, float]) -> None:
    from mqttfl.data import synthetic

    for key, value in knobs.items():
        if key in KNOBS:
            setattr(synthetic, KNOBS[key], value)
        elif key == "walk":
            synthetic.WALK_SCALE = value
        elif key == "day":
            synthetic.SESSION_LEVEL_SIGMA = value
        elif key == "level":
            synthetic.WINDOW_LEVEL_SIGMA = value
        elif key == "speed":
            synthetic.WALK_TOP_SPEED = value
        else:
            raise SystemExit(
                f"unknown knob {key!r}; known: {', '.join([*KNOBS, 'walk', 'speed', 'level', 'day'])}"
            )


def _client_windows(shards: list[dict[str, Any]]) -> Iterator[tuple[Any, Any, Any]]:
    """Per client, all its windows (train and test), their session ids and labels."""
    for federation in shards:
        for s in federation.values():
            yield (
                np.concatenate([s.x_train, s.x_test]),
                np.concatenate([s.s_train, s.s_test]),
                np.concatenate([s.y_train, s.y_test]),
            )


def _medians(cvs: dict[str, list[float]]) -> dict[str, float]:
    return {k: round(float(np.median(v)), 4) for k, v in cvs.items() if v}


def within_session(shards: list[dict[str, Any]]) -> dict[str, float]:
    """Per (client, session, label), the CV of the windows' mean amplitude; medians over
    the empty room (label 0) and over rooms with people (labels >= 1)."""
    cvs: dict[str, list[float]] = {"empty": [], "people": []}
    for x, ids, y in _client_windows(shards):
        for k in np.unique(ids):
            for c in np.unique(y[ids == k]):
                rows = x[(ids == k) & (y == c)]
                if len(rows) < 3:
                    continue
                level = rows.mean(axis=tuple(range(1, rows.ndim)))
                cvs["empty" if c == 0 else "people"].append(float(level.std() / level.mean()))
    return _medians(cvs)


def between_sessions(shards: list[dict[str, Any]]) -> dict[str, float]:
    """Per client and label, the CV of its sessions' mean amplitudes; medians over the
    empty room (label 0) and over rooms with people (labels >= 1)."""
    cvs: dict[str, list[float]] = {"empty": [], "people": []}
    for x, ids, y in _client_windows(shards):
        for c in np.unique(y):
            means = [float(x[(ids == k) & (y == c)].mean()) for k in np.unique(ids[y == c])]
            if len(means) > 1:
                cvs["empty" if c == 0 else "people"].append(float(np.std(means) / np.mean(means)))
    return _medians(cvs)


def local_scores(seed: int, overrides: list[str]) -> dict[str, float]:
    """Local under the papers' split, on validation: mean client accuracy (%) and MAE."""
    from benchmarks.bench_sessions import SOURCES, federate, load

    extra = ["data.validation_fraction=0.2", *overrides]
    config, federations = load(SOURCES["default"], seed, "window", extra)
    accuracy: list[float] = []
    mae: list[float] = []
    fit: list[float] = []  # on the training windows: whether the model fits at all
    for shards in federations:
        result = federate(config, shards, "local")
        for cid, side in result.sides.items():
            shard = shards[cid]
            predicted = side.predict(shard.x_test)
            accuracy.append(float(np.mean(predicted == shard.y_test)))
            mae.append(float(np.mean(np.abs(predicted - shard.y_test))))
            fit.append(float(np.mean(side.predict(shard.x_train) == shard.y_train)))
    return {
        "local_accuracy": 100 * float(np.mean(accuracy)),
        "local_mae": float(np.mean(mae)),
        "local_train_accuracy": 100 * float(np.mean(fit)),
    }


def measure(
    knobs: dict[str, float], overrides: list[str], seed: int = 0, *, train: bool = True
) -> dict[str, Any]:
    from benchmarks.bench_sessions import SOURCES, load

    set_knobs(knobs)
    started = time.monotonic()
    _, session_shards = load(SOURCES["default"], seed, "session", [])
    out: dict[str, Any] = {"knobs": knobs, "overrides": overrides, "seed": seed}
    out["within_session_label_cv"] = within_session(session_shards)
    out["between_sessions_cv"] = between_sessions(session_shards)
    if train:
        out.update({k: round(v, 3) for k, v in local_scores(seed, overrides).items()})
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def espectre_levels() -> dict[str, Any] | None:
    """The real side of ``within`` and ``between``, from ESPectre's raw recordings
    (amplitude as captured, not the job's z-scored features, whose means are near zero),
    windows of 64 packets, one session of one label each: within a recording, the CV of
    its windows' mean amplitude, for the quiet rooms (``baseline``) and one person moving
    (``movement``); between the recordings of one chip and label, the CV of their mean
    amplitudes. Medians over recordings, and over chip-label pairs."""
    from mqttfl.config import DataConfig
    from mqttfl.data.capture import load_capture
    from mqttfl.data.espectre import espectre_recordings
    from mqttfl.data.preprocess import capture_features, gather_windows, window_starts
    from mqttfl.data.sources import shared_data_root

    root = shared_data_root(DataConfig()) / "espectre"
    if not root.is_dir():
        return None
    within: dict[str, list[float]] = {"quiet": [], "movement": []}
    between: dict[str, list[float]] = {"quiet": [], "movement": []}
    for recordings in espectre_recordings(root).values():
        for raw, kind in (("baseline", "quiet"), ("movement", "movement")):
            means = []
            for rec in (r for r in recordings if r.kind == raw):
                rows, _ = capture_features(load_capture(rec.path, "npz"))
                starts = window_starts(len(rows), 64, None)
                level = gather_windows(rows, starts, 64).mean(axis=(1, 2))
                within[kind].append(float(level.std() / level.mean()))
                means.append(float(level.mean()))
            if len(means) > 1:
                between[kind].append(float(np.std(means) / np.mean(means)))
    return {
        "within_session_cv": _medians(within),
        "between_sessions_cv": _medians(between),
    }


def _parse(args: list[str]) -> dict[str, float]:
    knobs: dict[str, float] = {}
    for arg in args:
        key, _, value = arg.partition("=")
        try:
            knobs[key] = float(value)
        except ValueError:
            raise SystemExit(f"{arg!r}: expected knob=number") from None
    return knobs


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    if argv[:1] == ["--real"]:
        print(json.dumps({"espectre": espectre_levels()}))
        return
    train = "--no-train" not in argv
    settings = [a for a in argv if not a.startswith("--")]
    overrides = [a for a in settings if "." in a.partition("=")[0] or a.startswith("rounds=")]
    knobs = _parse([a for a in settings if a not in overrides])
    result = measure(knobs, overrides, train=train)
    log(f"calibration {result}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
