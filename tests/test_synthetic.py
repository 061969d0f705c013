"""The synthetic multi-room CSI crowd-counting generator."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from mqttfl.data.synthetic import ROOM_NAMES, make_room_shard, room_profile

SMALL: dict[str, Any] = {"window": 16, "samples": 100}


def test_deterministic_for_the_same_arguments() -> None:
    a = make_room_shard(3, seed=7, **SMALL)
    b = make_room_shard(3, seed=7, **SMALL)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert a.meta == b.meta


def test_seed_and_client_change_the_data() -> None:
    base = make_room_shard(0, seed=1, **SMALL)
    other_seed = make_room_shard(0, seed=2, **SMALL)
    same_room = make_room_shard(6, seed=1, **SMALL)  # room 0 again, own sample stream
    assert other_seed.x_train.shape != base.x_train.shape or not np.array_equal(
        other_seed.x_train, base.x_train
    )
    assert same_room.meta["room"] == base.meta["room"] == ROOM_NAMES[0]
    assert same_room.meta["subcarriers"] == base.meta["subcarriers"]
    assert not np.array_equal(same_room.x_train, base.x_train)


def test_dtypes_shapes_and_ranges() -> None:
    shard = make_room_shard(2, seed=0, **SMALL)
    s = shard.meta["subcarriers"]
    assert shard.x_train.dtype == np.float32
    assert shard.y_train.dtype == np.int64
    assert shard.x_train.shape == (shard.num_train, 16, s)
    assert shard.x_test.shape == (shard.num_test, 16, s)
    assert shard.y_train.min() >= 0
    assert shard.y_train.max() <= 20
    assert np.isfinite(shard.x_train).all()
    assert (shard.x_train >= 0).all()
    assert 0.1 < float(shard.x_train.mean()) < 5.0  # amplitudes are O(1)
    assert shard.meta["source"] == "synthetic"
    assert shard.meta["window"] == 16
    assert shard.meta["label_counts"] == {str(k): v for k, v in shard.label_counts.items()}


def test_split_is_80_20_and_stratified() -> None:
    shard = make_room_shard(1, seed=0, window=8, samples=200)
    assert (shard.num_train, shard.num_test) == (160, 40)
    y = np.concatenate([shard.y_train, shard.y_test])
    for label in np.unique(y):
        total = int((y == label).sum())
        assert abs(int((shard.y_test == label).sum()) - 0.2 * total) <= 1


def test_rooms_differ_in_device_and_label_skew() -> None:
    rooms = [room_profile(i, seed=0) for i in range(len(ROOM_NAMES))]
    assert [r.name for r in rooms] == list(ROOM_NAMES)
    assert len({r.device.subcarriers for r in rooms}) == 6
    for r in rooms:
        covered = np.flatnonzero(r.label_probs)
        assert 10 <= covered.size <= 15  # some of the 0..20 counts never occur
        assert np.isclose(r.label_probs.sum(), 1.0)
    supports = {tuple(np.flatnonzero(r.label_probs)) for r in rooms}
    assert len(supports) > 1
    # the sampled labels respect the room's support
    shard = make_room_shard(4, seed=0, **SMALL)
    assert set(shard.classes_present) <= set(np.flatnonzero(rooms[4].label_probs))


def test_subcarriers_follow_the_room() -> None:
    shards = [make_room_shard(c, seed=5, window=4, samples=10) for c in range(6)]
    assert len({s.meta["subcarriers"] for s in shards}) == 6


def test_small_class_counts_work() -> None:
    shard = make_room_shard(0, seed=0, window=4, samples=20, num_classes=4)
    assert shard.y_train.max() < 4
    assert shard.num_test == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "must be non-negative"),
        ({"seed": 0, "window": 0}, "need window >= 1"),
        ({"seed": 0, "samples": 1}, "samples >= 2"),
        ({"seed": 0, "test_fraction": 1.0}, "test_fraction must be in"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make_room_shard(0, **kwargs)


def test_one_device_for_every_room() -> None:
    shards = [make_room_shard(c, seed=5, window=4, samples=10, device="esp32") for c in range(6)]
    assert {s.meta["device"] for s in shards} == {"esp32"}
    assert {s.x_train.shape[1:] for s in shards} == {(4, 64)}
    # the rooms still differ in everything but the NIC
    assert len({s.meta["room"] for s in shards}) == 6
    per_room = make_room_shard(0, seed=5, window=4, samples=10)
    assert room_profile(0, seed=5, device="esp32").size == room_profile(0, seed=5).size
    assert per_room.meta["room"] == shards[0].meta["room"]


def test_unknown_device_is_named() -> None:
    with pytest.raises(ValueError, match="wifi7"):
        room_profile(0, seed=0, device="wifi7")


def test_config_offers_exactly_the_simulated_devices() -> None:
    from typing import get_args

    from mqttfl.config import DataConfig
    from mqttfl.data.synthetic import DEVICES

    choices = set(get_args(DataConfig.model_fields["device"].annotation))
    assert choices == {"per-room", *(d.name for d in DEVICES)}


def test_a_recording_day_holds_one_gain_for_every_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session level is the day's AGC setting, the same for every count recorded that
    day, and it differs between days by SESSION_LEVEL_SIGMA (calibrated to 0: the static
    drift between days already moves the level more than ESPectre's do; a spread is
    set here to see the mechanism)."""
    from mqttfl.data import synthetic

    monkeypatch.setattr(synthetic, "SESSION_LEVEL_SIGMA", 0.3)
    room = room_profile(0, seed=0)
    levels = synthetic.draw_sessions(np.random.default_rng(0), room, 400)["level"]
    assert levels.shape == (room.label_probs.size, 400)
    np.testing.assert_array_equal(levels, np.broadcast_to(levels[0], levels.shape))
    assert np.std(np.log(levels[0])) == pytest.approx(0.3, rel=0.15)


def test_an_empty_room_wobbles_from_window_to_window_as_a_quiet_recording_does() -> None:
    """Within one day, an empty room's windows differ in mean amplitude by about
    WINDOW_LEVEL_SIGMA (the gain's wobble), as ESPectre's quiet recordings do (CV 0.011,
    benchmarks/calibrate_rooms.py); without it an empty room measures 0.003."""
    from mqttfl.data import synthetic

    room = room_profile(3, seed=0, device="esp32")
    rng = np.random.default_rng(1)
    scenes = synthetic.draw_sessions(rng, room, 1)
    y = np.zeros(200, np.int64)
    scene = {k: v[y, np.zeros(200, np.int64)] for k, v in scenes.items()}
    level = synthetic.simulate(rng, room, y, scene, 64).mean(axis=(1, 2))
    cv = float(level.std() / level.mean())
    assert synthetic.WINDOW_LEVEL_SIGMA > 0
    assert cv == pytest.approx(synthetic.WINDOW_LEVEL_SIGMA, rel=0.35)
