"""Calibration: how far a session's channel moves between windows and between sessions,
in real recordings and in the simulator, measured the same way.

Per window, its profile: the mean amplitude of each subcarrier over the window, divided
by the profile's own mean (so an AGC level is not counted). Within a session, ``within``
is the median distance between two windows' profiles (RMS over subcarriers); between two
sessions of the same scene, ``between`` is the distance of their mean profiles. The
ratio between/within says whether a session is a fingerprint (>> 1: windows of one
session resemble each other far more than another session) or not.

- real: the ESPectre quiet-room recordings (``baseline/``, two sessions per chip, no one
  in the room; the chips with gain locked), windows of 64 packets;
- simulator: the empty room (count 0) and a few people (counts 3-5) of each room, the
  three recording days of client ``room``, windows of 64 packets on the ESP32 grid
  (``data.device=esp32``) and on each room's own NIC.

And the level a session holds and how it wobbles (``levels``,
:mod:`benchmarks.calibrate_rooms`), on raw amplitude: within a recording, the CV of its
windows' mean amplitude; between the recordings of one chip (client) and label, the CV of
their means; ESPectre's quiet rooms against the default job's empty rooms, and Local under
the papers' split (on validation) against the paper's Local row.

No recording of a seated crowd on several days is at hand, so the people-present rows
have no real counterpart here; the ESP32 crowd set (3 sessions per room, kept
outside the repository) is where the days-per-room figure (3) comes from.

    python -m benchmarks.bench_calibration
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np

from benchmarks.common import bench_main, log

WINDOW = 64


def _profiles(x: np.ndarray) -> np.ndarray:
    """(n, T, S) windows -> (n, S) mean profiles, each divided by its own mean."""
    profile = x.mean(axis=1)
    profiles: np.ndarray = profile / profile.mean(axis=1, keepdims=True)
    return profiles


def _rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))


def session_ratio(sessions: list[np.ndarray]) -> dict[str, float]:
    """within, between and their ratio for the window profiles of two or more sessions."""
    within = [_rms(p[i], p[j]) for p in sessions for i, j in combinations(range(len(p)), 2)]
    between = [_rms(a.mean(axis=0), b.mean(axis=0)) for a, b in combinations(sessions, 2)]
    w, b = float(np.median(within)), float(np.median(between))
    return {"within": round(w, 4), "between": round(b, 4), "ratio": round(b / w, 2)}


def real_espectre() -> dict[str, Any]:
    from mqttfl.config import DataConfig
    from mqttfl.data.capture import load_capture
    from mqttfl.data.espectre import espectre_recordings
    from mqttfl.data.preprocess import capture_features, gather_windows, window_starts
    from mqttfl.data.sources import shared_data_root

    root = shared_data_root(DataConfig()) / "espectre"
    if not root.is_dir():
        return {"absent": f"no ESPectre recordings at {root}"}
    out: dict[str, Any] = {}
    for chip, recordings in espectre_recordings(root).items():
        quiet = [r for r in recordings if r.kind == "baseline"]
        if len(quiet) < 2:
            continue
        sessions = []
        for rec in quiet:
            rows, _ = capture_features(load_capture(rec.path, "npz"))
            starts = window_starts(len(rows), WINDOW, None)
            sessions.append(_profiles(gather_windows(rows, starts, WINDOW)))
        out[chip] = session_ratio(sessions)
        log(f"espectre {chip}: {out[chip]}")
    return out


def simulator(device: str, counts: tuple[int, ...]) -> dict[str, Any]:
    from mqttfl.data import synthetic as sim

    out: dict[str, Any] = {}
    for room in range(len(sim.ROOM_NAMES)):
        profile = sim.room_profile(room, seed=0, device=device)
        rng = np.random.default_rng([0, 1, room])
        scenes = sim.draw_sessions(rng, profile, sim.SESSIONS_PER_COUNT)
        rows = []
        for count in counts:
            sessions = []
            for day in range(sim.SESSIONS_PER_COUNT):
                n = 12
                y = np.full(n, count)
                scene = {k: v[y, np.full(n, day)] for k, v in scenes.items()}
                sessions.append(_profiles(sim.simulate(rng, profile, y, scene, WINDOW)))
            rows.append(session_ratio(sessions))
        if rows:
            out[f"{room}:{profile.name}:{profile.device.name}"] = {
                k: round(float(np.median([r[k] for r in rows])), 4)
                for k in ("within", "between", "ratio")
            }
    return out


def levels_and_local(quick: bool) -> dict[str, Any]:
    """The targets and the figures reached: the level statistics on raw amplitude, real
    (ESPectre) against the default job's rooms, and Local under the papers' split on
    validation against the paper's Local row (:mod:`benchmarks.calibrate_rooms`)."""
    import torch

    from benchmarks.calibrate_rooms import TARGETS, espectre_levels, measure
    from mqttfl.data import synthetic

    torch.set_num_threads(1)  # the same figures as calibrate_rooms' command line
    real = espectre_levels()
    reached = measure({}, [], train=not quick)
    out: dict[str, Any] = {
        "simulator": {
            "session_level_sigma": synthetic.SESSION_LEVEL_SIGMA,
            "window_level_sigma": synthetic.WINDOW_LEVEL_SIGMA,
        },
        "targets": {
            "within_session_cv": {"empty": "ESPectre quiet", "people": "none recorded"},
            "between_sessions_cv": {"empty": "ESPectre quiet", "people": "none recorded"},
            **TARGETS,
        },
        "espectre": real if real is not None else {"absent": "no ESPectre recordings"},
        "reached": reached,
    }
    if not quick:  # four times the default job's windows: the paper's difficulty
        out["reached_1600_windows"] = measure({}, ["data.samples_per_client=1600"])
    log(f"levels: real {real}; simulator {reached}")
    return out


def run(quick: bool) -> dict[str, Any]:
    result = {
        "levels": levels_and_local(quick),
        "window": WINDOW,
        "real_espectre_quiet_room": real_espectre(),
        "simulator_empty_room_esp32": simulator("esp32", (0,)),
        "simulator_empty_room_own_nic": simulator("per-room", (0,)),
        "simulator_3_to_5_people_esp32": simulator("esp32", (3, 4, 5)),
    }
    for key, rows in result.items():
        if key != "levels" and isinstance(rows, dict) and rows and "absent" not in rows:
            ratios = [r["ratio"] for r in rows.values()]
            log(f"{key}: median ratio {np.median(ratios):.2f} ({min(ratios)}-{max(ratios)})")
    return result


if __name__ == "__main__":
    bench_main("calibration", __doc__ or "", run)
