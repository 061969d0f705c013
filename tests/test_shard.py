"""Shard validation and its atomic on-disk format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mqttfl.data.shard as shard_mod
from mqttfl.data.shard import Shard, load_shard, save_shard
from mqttfl.errors import DataError


def make_shard(n_train: int = 12, n_test: int = 4, shape: tuple[int, ...] = (8, 5)) -> Shard:
    rng = np.random.default_rng(0)
    return Shard(
        x_train=rng.random((n_train, *shape), dtype=np.float32),
        y_train=np.arange(n_train, dtype=np.int64) % 3,
        x_test=rng.random((n_test, *shape), dtype=np.float32),
        y_test=np.arange(n_test, dtype=np.int64) % 3,
        meta={"source": "test", "window": shape[0]},
    )


def test_round_trip(tmp_path: Path) -> None:
    shard = make_shard()
    save_shard(shard, tmp_path / "c0")
    loaded = load_shard(tmp_path / "c0")
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(loaded, key), getattr(shard, key))
        assert getattr(loaded, key).dtype == getattr(shard, key).dtype
    assert loaded.meta == shard.meta
    assert sorted(p.name for p in (tmp_path / "c0").iterdir()) == ["meta.json", "shard.npz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0"]  # no temp dirs left


def test_properties() -> None:
    shard = make_shard(n_train=7, n_test=2, shape=(6,))
    assert (shard.num_train, shard.num_test, shard.sample_shape) == (7, 2, (6,))
    np.testing.assert_array_equal(shard.classes_present, [0, 1, 2])
    assert shard.label_counts == {0: 3, 1: 2, 2: 2}


def test_save_replaces_an_existing_shard(tmp_path: Path) -> None:
    save_shard(make_shard(n_train=12), tmp_path / "c0")
    save_shard(make_shard(n_train=5), tmp_path / "c0")
    assert load_shard(tmp_path / "c0").num_train == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0"]


def test_failed_save_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(shard_mod, "_write_meta", boom)
    with pytest.raises(DataError, match="c0: cannot write: disk full"):
        save_shard(make_shard(), tmp_path / "c0")
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_shard(make_shard(n_train=12), tmp_path / "c0")

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(shard_mod, "_write_arrays", boom)
    with pytest.raises(DataError):
        save_shard(make_shard(n_train=5), tmp_path / "c0")
    assert load_shard(tmp_path / "c0").num_train == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c0"]


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_shard(tmp_path / "nope")
    assert info.value.path == str(tmp_path / "nope")


def test_corrupt_npz_is_named(tmp_path: Path) -> None:
    save_shard(make_shard(), tmp_path / "c0")
    (tmp_path / "c0" / "shard.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(DataError) as info:
        load_shard(tmp_path / "c0")
    assert info.value.path == str(tmp_path / "c0" / "shard.npz")


def test_bad_meta_is_named(tmp_path: Path) -> None:
    save_shard(make_shard(), tmp_path / "c0")
    meta = tmp_path / "c0" / "meta.json"
    meta.write_text("{broken")
    with pytest.raises(DataError) as info:
        load_shard(tmp_path / "c0")
    assert info.value.path == str(meta)
    meta.unlink()
    with pytest.raises(DataError, match="not found"):
        load_shard(tmp_path / "c0")


def _write_npz(directory: Path, **arrays: np.ndarray) -> None:
    directory.mkdir()
    # numpy's default, spelled out: the object-array case below has to be writable
    np.savez(directory / "shard.npz", allow_pickle=True, **arrays)
    (directory / "meta.json").write_text(json.dumps({"source": "test"}))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"y_train": np.zeros(3, np.int64)}, "4 samples but y_train has 3"),
        ({"x_train": np.zeros((4, 2, 2), np.float64)}, "float32"),
        ({"y_test": np.zeros(2, np.int32)}, "int64"),
        ({"x_test": np.array([object()] * 2)}, "corrupt npz"),
    ],
)
def test_inconsistent_arrays_are_rejected(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    good: dict[str, np.ndarray] = {
        "x_train": np.zeros((4, 2, 2), np.float32),
        "y_train": np.zeros(4, np.int64),
        "x_test": np.zeros((2, 2, 2), np.float32),
        "y_test": np.zeros(2, np.int64),
    }
    _write_npz(tmp_path / "c0", **{**good, **arrays})
    with pytest.raises(DataError, match=message) as info:
        load_shard(tmp_path / "c0")
    assert info.value.path == str(tmp_path / "c0" / "shard.npz")


def test_missing_array_is_named(tmp_path: Path) -> None:
    _write_npz(tmp_path / "c0", x_train=np.zeros((1, 2), np.float32))
    with pytest.raises(DataError, match="missing arrays: y_train, x_test, y_test"):
        load_shard(tmp_path / "c0")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x_train": np.zeros((3, 2), np.float64)}, "float32"),
        ({"y_train": np.zeros(2, np.int64)}, "3 samples"),
        ({"x_train": np.full((3, 2), np.nan, np.float32)}, "NaN"),
        ({"x_test": np.zeros((1, 5), np.float32)}, "differ"),
        ({"y_train": np.array([0, -1, 0])}, "negative"),
        ({"meta": {"bad": object()}}, "JSON"),
    ],
)
def test_in_memory_validation(change: dict[str, object], message: str) -> None:
    parts: dict[str, object] = {
        "x_train": np.zeros((3, 2), np.float32),
        "y_train": np.zeros(3, np.int64),
        "x_test": np.zeros((1, 2), np.float32),
        "y_test": np.zeros(1, np.int64),
        "meta": {},
    }
    with pytest.raises(DataError, match=message) as info:
        Shard(**{**parts, **change})  # type: ignore[arg-type]
    assert info.value.path == "<memory>"
