"""Capture files -> client shards, `mqttfl data` commands, and the ESPectre federation."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mqttfl.commands.data import add_data_commands
from mqttfl.commands.main import main
from mqttfl.data.espectre import ESPECTRE_CHIPS, espectre_shard
from mqttfl.data.prepare import (
    ACTIVITIES,
    build_shards,
    inspect_shard,
    parse_subcarriers,
    prepare_shards,
    resolve_labels,
)
from mqttfl.data.preprocess import split_windows_by_time
from mqttfl.data.shard import load_shard
from mqttfl.errors import DataError
from tests._shared_data import require_shared


def _ramp_csv(path: Path, packets: int, columns: int = 4, offset: int = 0) -> Path:
    """A csv 'capture' whose every value is its packet number (so windows reveal packets)."""
    rows = [",".join([str(offset + t)] * columns) for t in range(packets)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _activity_files(n_per_label: int = 2) -> list[Path]:
    root = require_shared("csi-samples", "intel5300-activity")
    files = sorted(root.rglob("*.dat"))
    picked: list[Path] = []
    for act in ("brushteeth", "walk", "cook"):
        picked += [f for f in files if f.name.startswith(act + "_")][:n_per_label]
    return picked


# ----------------------------------------------------------------------------- labels


def test_labels_from_file_names_use_the_activity_vocabulary() -> None:
    paths = [Path("may/brushteeth_1590158645.dat"), Path("walk_post_1597163546.dat")]
    names, ys, classes = resolve_labels("filename", paths)
    assert names == ["brushteeth", "walk"]
    assert ys == [ACTIVITIES.index("brushteeth"), ACTIVITIES.index("walk")]
    assert classes == list(ACTIVITIES)
    with pytest.raises(DataError, match="no known activity") as info:
        resolve_labels("filename", [Path("dance_1.dat")])
    assert "dance_1.dat" in str(info.value)


def test_labels_from_regex_constant_and_classes() -> None:
    paths = [Path("baseline_c3_1.npz"), Path("movement_c3_2.npz")]
    names, ys, classes = resolve_labels("regex:^.*/?(baseline|movement)_", paths)
    assert names == ["baseline", "movement"]
    assert ys == [0, 1]
    assert classes == ["baseline", "movement"]
    _, ys, classes = resolve_labels(
        r"regex:(?P<label>baseline|movement)", paths, classes=["movement", "baseline"]
    )
    assert ys == [1, 0]
    assert classes == ["movement", "baseline"]
    assert resolve_labels("3", paths)[1:] == ([3, 3], None)
    assert resolve_labels(7, paths)[1] == [7, 7]
    with pytest.raises(DataError, match="does not match"):
        resolve_labels("regex:nothing", paths)
    with pytest.raises(DataError, match="not one of the classes"):
        resolve_labels("walk", paths, classes=["a", "b"])


def test_labels_from_mapping_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    a, b = tmp_path / "sub" / "a.dat", tmp_path / "b.dat"
    mapping = tmp_path / "labels.json"
    mapping.write_text(json.dumps({"sub/a.dat": "walk", "b.dat": "cook"}))
    assert resolve_labels(f"map:{mapping}", [a, b])[0] == ["walk", "cook"]
    table = tmp_path / "labels.csv"
    table.write_text("file,label\na.dat,1\nb,0\n")
    assert resolve_labels(str(table), [a, b])[1] == [1, 0]
    with pytest.raises(DataError, match="has no label") as info:
        resolve_labels(str(table), [tmp_path / "c.dat"])
    assert "c.dat" in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match=re.escape("bad.json")):
        resolve_labels(f"map:{bad}", [a])


def test_parse_subcarriers() -> None:
    assert parse_subcarriers("auto") is None
    assert parse_subcarriers("all") == "all"
    assert parse_subcarriers("0-2,5,7..8") == [0, 1, 2, 5, 7, 8]
    with pytest.raises(ValueError, match="bad subcarrier list item"):
        parse_subcarriers("x")


# ----------------------------------------------------------------------------- shards


def test_time_split_has_no_leak_and_round_trips(tmp_path: Path) -> None:
    a = _ramp_csv(tmp_path / "a.csv", 100)
    b = _ramp_csv(tmp_path / "b.csv", 60, offset=1000)
    out = tmp_path / "shard"
    dirs = prepare_shards(
        "csv", [a, b], labels=f"map:{_mapping(tmp_path, a=0, b=1)}", out=out, window=10, stride=5
    )
    assert dirs == [out]
    shard = load_shard(out)
    assert shard.x_train.shape[1:] == (10, 4)
    assert shard.x_train.dtype == np.float32
    for y, lo, hi in ((0, 0, 100), (1, 1000, 1060)):
        train = {int(v) for v in shard.x_train[shard.y_train == y][..., 0].ravel()}
        test = {int(v) for v in shard.x_test[shard.y_test == y][..., 0].ravel()}
        assert train
        assert test
        assert not train & test
        assert max(train) < min(test)
        assert lo <= min(train)
        assert max(test) < hi
    meta = shard.meta
    assert meta["window"] == 10
    assert meta["stride"] == 5
    assert meta["kind"] == "csi-windows"
    assert meta["source_files"] == [str(a), str(b)]
    assert meta["label_counts"]["train"] == {
        "0": int((shard.y_train == 0).sum()),
        "1": int((shard.y_train == 1).sum()),
    }
    summary = inspect_shard(out)
    assert summary["num_train"] == shard.num_train
    assert summary["sample_shape"] == [10, 4]
    json.dumps(summary)


def _mapping(tmp_path: Path, **labels: int) -> Path:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({f"{k}.csv": v for k, v in labels.items()}))
    return path


def test_normalization_is_fitted_on_train(tmp_path: Path) -> None:
    a = _ramp_csv(tmp_path / "a.csv", 100)
    shard = build_shards("csv", [a], labels="x", window=10, normalize=True)[0]
    norm = shard.meta["normalization"]
    assert abs(np.mean(shard.x_train)) < 1e-4
    assert norm["mean"][0] == pytest.approx(39.5)  # packets 0..79 only, not the test windows
    assert shard.x_test.mean() > 1.0


def test_feature_vector_shards(tmp_path: Path) -> None:
    np.savez(tmp_path / "f.npz", x=np.arange(40, dtype=np.float64).reshape(10, 4))
    shard = build_shards("npz", [tmp_path / "f.npz"], labels="1", features=True)[0]
    assert shard.x_train.shape == (8, 4)
    assert shard.x_test.shape == (2, 4)
    assert shard.x_test[:, 0].min() > shard.x_train[:, 0].max()
    assert shard.meta["kind"] == "features"


def test_clients_per_file_and_per_dir(tmp_path: Path) -> None:
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    files = [_ramp_csv(tmp_path / d / f"{n}.csv", 50) for d in ("d1", "d2") for n in ("x", "y")]
    out = tmp_path / "out"
    dirs = prepare_shards("csv", files, labels="0", out=out, window=10, per_file_clients=True)
    assert dirs == [out / f"client-{i}" for i in range(4)]
    assert [load_shard(d).meta["client_index"] for d in dirs] == [0, 1, 2, 3]
    shards = build_shards("csv", files, labels="0", window=10, group_by="dir")
    assert len(shards) == 2
    assert shards[1].meta["source_files"] == [str(f) for f in files[2:]]


@pytest.mark.shared_data
def test_intel_activity_shard(tmp_path: Path) -> None:
    files = _activity_files()
    out = tmp_path / "act"
    prepare_shards("intel5300", files, labels="filename", out=out, window=50, normalize=True)
    shard = load_shard(out)
    assert shard.x_train.shape[1:] == (50, 168)
    assert set(shard.meta["classes"]) == set(ACTIVITIES)
    wanted = {ACTIVITIES.index(a) for a in ("brushteeth", "walk", "cook")}
    assert set(np.unique(shard.y_train)) == wanted == set(np.unique(shard.y_test))
    assert shard.meta["subcarriers"]["removed_pilot"] == [7, 21]
    for f in shard.meta["files"]:
        assert (f["train"] + f["test"]) * 50 <= f["packets"]


# ----------------------------------------------------------------------------- errors


def _assert_clean(exc: pytest.ExceptionInfo[BaseException], path: Path, out: Path) -> None:
    assert str(path) in str(exc.value)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def test_unreadable_file_leaves_no_output(tmp_path: Path) -> None:
    good = _ramp_csv(tmp_path / "good.csv", 50)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\x00\xff\xfe garbage")
    out = tmp_path / "out"
    with pytest.raises(DataError) as info:
        prepare_shards("csv", [good, bad], labels="0", out=out, window=10, per_file_clients=True)
    _assert_clean(info, bad, out)
    missing = tmp_path / "missing.csv"
    with pytest.raises(DataError, match="not found") as info:
        prepare_shards("csv", [good, missing], labels="0", out=out, window=10)
    _assert_clean(info, missing, out)


def test_too_few_packets_names_the_file(tmp_path: Path) -> None:
    good = _ramp_csv(tmp_path / "good.csv", 50)
    short = _ramp_csv(tmp_path / "short.csv", 5)
    out = tmp_path / "out"
    with pytest.raises(DataError, match="too few packets") as info:
        prepare_shards("csv", [good, short], labels="0", out=out, window=10)
    _assert_clean(info, short, out)


def test_single_window_recordings_cannot_be_split(tmp_path: Path) -> None:
    one = _ramp_csv(tmp_path / "one.csv", 12)
    out = tmp_path / "out"
    with pytest.raises(DataError, match="train/test split") as info:
        prepare_shards("csv", [one], labels="0", out=out, window=10)
    _assert_clean(info, one, out)
    assert prepare_shards("csv", [one], labels="0", out=out, window=10, test_fraction=0.0) == [out]


def test_mismatched_subcarriers_in_one_client(tmp_path: Path) -> None:
    a = _ramp_csv(tmp_path / "a.csv", 50, columns=4)
    b = _ramp_csv(tmp_path / "b.csv", 50, columns=6)
    out = tmp_path / "out"
    with pytest.raises(DataError, match="same client") as info:
        prepare_shards("csv", [a, b], labels="0", out=out, window=10)
    _assert_clean(info, b, out)
    # one client per file is fine
    assert (
        len(prepare_shards("csv", [a, b], labels="0", out=out, window=10, per_file_clients=True))
        == 2
    )


@pytest.mark.shared_data
def test_wrong_format_and_mixed_devices(tmp_path: Path) -> None:
    intel = require_shared("csi-samples", "intel5300", "sample_0x1_ap.dat")
    ath = require_shared("csi-samples", "atheros", "ath_csi_1.dat")
    out = tmp_path / "out"
    with pytest.raises(DataError, match="not a valid intel5300") as info:
        prepare_shards("intel5300", [intel, ath], labels="0", out=out, window=10)
    _assert_clean(info, ath, out)
    passive = require_shared("csi-samples", "esp32", "example_data_passive_header.csv")
    with pytest.raises(DataError, match="format esp32") as info:
        prepare_shards("csv", [passive], labels="0", out=out, window=10)
    _assert_clean(info, passive, out)


def test_existing_output_is_not_touched(tmp_path: Path) -> None:
    a = _ramp_csv(tmp_path / "a.csv", 50)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        prepare_shards("csv", [a], labels="0", out=out, window=10)
    assert (out / "keep.txt").read_text() == "mine"
    prepare_shards("csv", [a], labels="0", out=out, window=10, overwrite=True)
    assert not (out / "keep.txt").exists()
    assert load_shard(out).num_train > 0


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqttfl")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_prepare_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _ramp_csv(tmp_path / "a.csv", 60)
    out = tmp_path / "out"
    args = _parser().parse_args(
        [
            "data",
            "prepare",
            "--format",
            "csv",
            "--input",
            str(a),
            "--label",
            "walk",
            "--out",
            str(out),
            "--window",
            "10",
            "--subcarriers",
            "0-2",
        ]
    )
    assert args.func(args) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert load_shard(out).x_train.shape[1:] == (10, 3)
    args = _parser().parse_args(["data", "inspect", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "train:" in text
    assert "walk" in text
    args = _parser().parse_args(["data", "inspect", str(out), "--json"])
    args.func(args)
    assert json.loads(capsys.readouterr().out)["num_train"] == load_shard(out).num_train


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "data",
            "prepare",
            "--format",
            "csv",
            "--input",
            str(tmp_path / "nope.csv"),
            "--label",
            "0",
            "--out",
            str(out),
            "--window",
            "10",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "nope.csv" in err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- ESPectre


@pytest.mark.shared_data
def test_espectre_federation() -> None:
    root = require_shared("espectre")
    window = 64
    assert ESPECTRE_CHIPS == ("c3", "c5", "c6", "esp32", "s3")
    shapes = set()
    for cid, chip in enumerate(ESPECTRE_CHIPS):
        shard = espectre_shard(cid, root=root, window=window)
        shapes.add(shard.sample_shape)
        assert shard.meta["chip"] == chip
        for y in (shard.y_train, shard.y_test):
            assert set(np.unique(y)) == {0, 1}
        assert np.isfinite(shard.x_train).all()
        files = shard.meta["files"]
        if chip == "c3":  # held-out test recording, windowed on each side of packet 3040
            test_file = next(f for f in files if "test_c3" in f["path"])
            assert test_file["train"] == 0
            assert test_file["motion_start"] == 3040
            assert test_file["test_per_label"] == {
                "quiet": 3040 // window,
                "movement": (test_file["packets"] - 3040) // window,
            }
            assert all(f["test"] == 0 for f in files if f is not test_file)
        else:  # split by time inside each recording: windows never overlap
            for f in files:
                assert f["test"] >= 1
                assert (f["train"] + f["test"]) * window <= f["packets"]
    assert shapes == {(window, 51)}


@pytest.mark.shared_data
def test_espectre_overlapping_stride_still_splits_cleanly() -> None:
    root = require_shared("espectre")
    shard = espectre_shard(1, root=root, window=100, stride=50, normalize=False)
    for f in shard.meta["files"]:
        train, test = split_windows_by_time(f["packets"], 100, 50, 0.2)
        assert (f["train"], f["test"]) == (len(train), len(test))
        assert train.max() + 100 <= test.min()  # no packet in both


def test_espectre_missing_root_names_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found") as info:
        espectre_shard(0, root=tmp_path / "nowhere", window=64)
    assert str(tmp_path / "nowhere") in str(info.value)
