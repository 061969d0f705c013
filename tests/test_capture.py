"""Capture parsing (csiread + structure checks) and the FedAPA preprocessing steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mqttfl.data.capture import load_capture, read_capture, read_features
from mqttfl.data.capture_checks import walk_atheros
from mqttfl.data.capture_esp32 import esp_iq_to_complex, parse_esp32_csv_tolerant
from mqttfl.data.preprocess import (
    Normalizer,
    capture_features,
    make_windows,
    sanitize_phase,
    select_subcarriers,
    split_windows_by_time,
    window_starts,
)
from mqttfl.errors import DataError
from tests._shared_data import require_shared

NEXMON = {"example_4358.pcap": ("4358", 80), "example_43455c0.pcap": ("43455c0", 80)}

# (relative path, format, parsed shape, subcarriers kept by default, kept with pilots)
SAMPLES = [
    ("intel5300/sample_0x1_ap.dat", "intel5300", (540, 30, 3, 2), 28, 30),
    ("intel5300/sample_0x5_64_3000.dat", "intel5300", (2998, 30, 3, 2), 28, 30),
    ("intel5300/example.dat", "intel5300", (26, 30, 3, 2), 28, 30),
    ("atheros/ath_csi_1.dat", "atheros", (401, 56, 3, 2), 52, 56),
    ("nexmon/example_4358.pcap", "nexmon", (4, 256), 234, 242),
    ("nexmon/example_43455c0.pcap", "nexmon", (566, 256), 234, 242),
    ("esp32/example_csi.csv", "esp32", (13, 64), 47, 51),
    # csiread fails on the header row of this PASSIVE capture; the tolerant reader parses it
    ("esp32/example_data_passive_header.csv", "esp32", (60, 64), 47, 51),
]
FORMAT_OF_DIR = {
    "intel5300": "intel5300",
    "intel5300-activity": "intel5300",
    "atheros": "atheros",
    "nexmon": "nexmon",
    "esp32": "esp32",
}


def _kwargs(path: Path) -> dict[str, Any]:
    if path.name in NEXMON:
        chip, bw = NEXMON[path.name]
        return {"nexmon_chip": chip, "nexmon_bw": bw}
    return {}


@pytest.mark.shared_data
@pytest.mark.parametrize(("rel", "fmt", "shape", "kept", "kept_with_pilots"), SAMPLES)
def test_sample_files_parse_to_documented_shapes(
    rel: str, fmt: str, shape: tuple[int, ...], kept: int, kept_with_pilots: int
) -> None:
    path = require_shared("csi-samples", rel)
    csi = read_capture(path, fmt, **_kwargs(path))
    assert csi.shape == shape
    assert csi.dtype == np.complex64
    assert np.abs(csi).max() > 0
    cap = load_capture(path, fmt, **_kwargs(path))
    assert len(select_subcarriers(cap).positions) == kept
    assert len(select_subcarriers(cap, drop_pilots=False).positions) == kept_with_pilots


@pytest.mark.shared_data
def test_every_sample_file_parses_or_fails_clearly() -> None:
    root = require_shared("csi-samples")
    seen = 0
    for path in sorted(
        p for p in root.rglob("*") if p.is_file() and not p.name.startswith("LICENSE")
    ):
        fmt = FORMAT_OF_DIR[path.relative_to(root).parts[0]]
        csi = read_capture(path, fmt, **_kwargs(path))  # a DataError names the path
        assert csi.ndim >= 2
        assert csi.shape[0] > 0
        seen += 1
    assert seen >= 30


@pytest.mark.shared_data
def test_intel5300_activity_recordings_parse() -> None:
    root = require_shared("csi-samples", "intel5300-activity")
    files = sorted(root.rglob("*.dat"))
    assert len(files) >= 20
    for path in files:
        cap = load_capture(path, "intel5300")
        assert cap.csi.shape[1:] == (30, 3, 2)
        assert cap.csi.shape[0] >= 100
        assert cap.phy == "ht20"


@pytest.mark.shared_data
def test_esp32_tolerant_reader_matches_csiread() -> None:
    path = require_shared("csi-samples", "esp32", "example_csi.csv")
    via_csiread = load_capture(path, "esp32")
    assert via_csiread.info["parser"] == "csiread"
    raw, secondary, _ = parse_esp32_csv_tolerant(path, path.read_text())
    tolerant = esp_iq_to_complex(raw)
    tolerant[secondary != 0] = np.fft.ifftshift(tolerant[secondary != 0], axes=1)
    np.testing.assert_allclose(via_csiread.csi, tolerant)


@pytest.mark.shared_data
@pytest.mark.parametrize("rel", ["esp32/example_csi.csv", "esp32/example_data_passive_header.csv"])
def test_esp32_layouts_leave_no_null_subcarrier(rel: str) -> None:
    # example_csi.csv is centred (secondary channel above), the PASSIVE one in FFT order;
    # after re-ordering, the legacy20 plan removes exactly the all-zero guard bins
    path = require_shared("csi-samples", rel)
    rows, _ = capture_features(load_capture(path, "esp32"))
    assert rows.shape == (rows.shape[0], 47)
    assert (rows.mean(axis=0) > 1.0).all()


@pytest.mark.shared_data
def test_espectre_npz_chip_layouts_agree() -> None:
    root = require_shared("espectre")
    for chip in ("c3", "c5", "c6", "esp32", "s3"):
        path = sorted((root / "baseline").glob(f"baseline_{chip}_*.npz"))[0]
        cap = load_capture(path, "npz")
        assert cap.csi.shape[1] == 64
        assert cap.phy == "ht20"
        rows, sel = capture_features(cap)
        assert rows.shape[1] == 51
        assert sel.index is not None
        assert sel.index == tuple(sorted(sel.index))
        assert (rows.mean(axis=0) > 5.0).all(), chip  # no null bin slipped through


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("rel", "wrong"),
    [
        ("atheros/ath_csi_1.dat", "intel5300"),  # csiread.Intel segfaults on this without the check
        ("intel5300/example.dat", "atheros"),
        ("intel5300/example.dat", "nexmon"),
        ("intel5300/example.dat", "esp32"),
        ("intel5300/example.dat", "npz"),
        ("intel5300/example.dat", "csv"),
        ("nexmon/example_43455c0.pcap", "atheros"),
        ("nexmon/example_4358.pcap", "intel5300"),
        ("esp32/example_csi.csv", "intel5300"),
        ("esp32/example_csi.csv", "csv"),
    ],
)
def test_wrong_format_is_a_clear_error(rel: str, wrong: str) -> None:
    path = require_shared("csi-samples", rel)
    with pytest.raises(DataError) as info:
        read_capture(path, wrong, nexmon_chip="4358", nexmon_bw=80)
    assert info.value.path == str(path)
    assert str(path) in str(info.value)


@pytest.mark.shared_data
def test_nexmon_needs_chip_and_matching_bandwidth() -> None:
    path = require_shared("csi-samples", "nexmon", "example_43455c0.pcap")
    with pytest.raises(DataError, match="chip and bandwidth"):
        read_capture(path, "nexmon")
    with pytest.raises(DataError, match="nexmon-bw"):
        read_capture(path, "nexmon", nexmon_chip="43455c0", nexmon_bw=20)
    with pytest.raises(DataError, match="unknown nexmon chip"):
        read_capture(path, "nexmon", nexmon_chip="9999", nexmon_bw=80)


@pytest.mark.parametrize("fmt", ["intel5300", "atheros", "nexmon", "esp32", "npz", "csv"])
def test_unreadable_files_name_the_file(tmp_path: Path, fmt: str) -> None:
    kw: dict[str, Any] = {"nexmon_chip": "4358", "nexmon_bw": 80}
    missing = tmp_path / "missing.dat"
    with pytest.raises(DataError, match="not found") as info:
        read_capture(missing, fmt, **kw)
    assert info.value.path == str(missing)
    empty = tmp_path / "empty.dat"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        read_capture(empty, fmt, **kw)
    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(DataError) as info:
        read_capture(noise, fmt, **kw)
    assert str(noise) in str(info.value)
    with pytest.raises(DataError, match="directory"):
        read_capture(tmp_path, fmt, **kw)


@pytest.mark.shared_data
def test_truncated_intel_record_is_tolerated(tmp_path: Path) -> None:
    src = require_shared("csi-samples", "intel5300", "example.dat")
    cut = tmp_path / "cut.dat"
    cut.write_bytes(src.read_bytes()[:-100])
    assert read_capture(cut, "intel5300").shape == (25, 30, 3, 2)


def _atheros_record(tones: int = 56, nr: int = 1, nc: int = 1) -> bytes:
    """One little-endian Atheros CSI Tool record: length, 25-byte header, CSI, no payload."""
    csi_len = (nr * nc * tones * 20 + 7) // 8
    header = bytearray(25)
    header[8:10] = csi_len.to_bytes(2, "little")
    header[16:19] = bytes([tones, nr, nc])
    body = bytes(header) + bytes(range(256))[:csi_len]
    return len(body).to_bytes(2, "little") + body


def test_generated_atheros_records_walk_and_a_cut_one_names_its_offset(tmp_path: Path) -> None:
    record = _atheros_record()
    whole = record * 3
    assert walk_atheros(tmp_path / "x.dat", whole, "little") == (3, 1, 1, 56)
    for cut in (1, len(record) - 2, len(record) - 1):  # inside the last record
        path = tmp_path / f"cut-{cut}.dat"
        path.write_bytes(whole[:-cut])
        with pytest.raises(DataError, match=f"truncated Atheros record at byte {2 * len(record)}"):
            read_capture(path, "atheros")
    path = tmp_path / "tail.dat"
    path.write_bytes(whole + b"\x00")  # one stray byte: not even a record length
    with pytest.raises(DataError, match=f"at byte {3 * len(record)}") as info:
        read_capture(path, "atheros")
    assert info.value.path == str(path)


@pytest.mark.shared_data
def test_truncated_atheros_file_names_the_path_and_offset(tmp_path: Path) -> None:
    data = require_shared("csi-samples", "atheros", "ath_csi_1.dat").read_bytes()
    starts, pos = [], 0  # record offsets: each record is a 2-byte length + that many bytes
    while pos < len(data):
        starts.append(pos)
        pos += 2 + int.from_bytes(data[pos : pos + 2], "little")
    assert pos == len(data)
    assert len(starts) == 401
    for cut, record in ((100, starts[-1]), (len(data) - starts[10] - 40, starts[10])):
        path = tmp_path / f"cut-{cut}.dat"
        path.write_bytes(data[:-cut])
        with pytest.raises(DataError) as info:
            read_capture(path, "atheros")
        assert info.value.path == str(path)
        assert f"truncated Atheros record at byte {record}:" in str(info.value)


def test_esp32_bad_rows_name_the_line(tmp_path: Path) -> None:
    good = "CSI_DATA,AP,aa,-1,11,1,0,0,1,1,0,0,0,0,-90,0,1,0,1,0,10,0,0,1.0,4,[1 2 3 4 ]\n"
    path = tmp_path / "esp.csv"
    path.write_text("type,role\n" + good + good.replace("[1 2 3 4 ]", "[1 2 3 4 5 6 ]"))
    with pytest.raises(DataError, match="line 3"):
        read_capture(path, "esp32")
    path.write_text("hello\nworld\n")
    with pytest.raises(DataError, match="no CSI_DATA rows"):
        read_capture(path, "esp32")


def test_npz_variants(tmp_path: Path) -> None:
    # ESP int8 interleaved (imaginary, real) pairs -> complex; a C5 recording is centred
    raw = np.zeros((3, 128), dtype=np.int8)
    raw[:, 1::2] = np.arange(64, dtype=np.int8)  # real part = position
    np.savez(tmp_path / "fft.npz", csi_data=raw, chip=np.array("c3"))
    np.savez(tmp_path / "centred.npz", csi_data=raw, chip=np.array("c5"))
    fft = read_capture(tmp_path / "fft.npz", "npz")
    assert fft.shape == (3, 64)
    assert fft[0, 5] == 5
    centred = read_capture(tmp_path / "centred.npz", "npz")
    assert centred[0, 0] == 32  # the DC bin, position 32 in centred order, moves to 0
    np.savez(tmp_path / "complex.npz", csi_data=np.ones((5, 7, 2), dtype=np.complex128))
    assert read_capture(tmp_path / "complex.npz", "npz").shape == (5, 7, 2)
    np.savez(tmp_path / "other.npz", data=np.ones((5, 7)))
    with pytest.raises(DataError, match="no 'csi_data'"):
        read_capture(tmp_path / "other.npz", "npz")
    np.savez(tmp_path / "empty.npz", csi_data=np.zeros((0, 64), dtype=np.int8))
    with pytest.raises(DataError):
        read_capture(tmp_path / "empty.npz", "npz")


def test_csv_rows_and_features(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("a,b,c\n1,2,3\n4,5,6\n")
    assert read_capture(path, "csv").shape == (2, 3)
    assert read_features(path, "csv").dtype == np.float32
    path.write_text("1,2,3\n4,5\n")
    with pytest.raises(DataError, match="line 2"):
        read_capture(path, "csv")
    np.savez(tmp_path / "f.npz", x=np.ones((4, 9)))
    assert read_features(tmp_path / "f.npz", "npz").shape == (4, 9)
    with pytest.raises(DataError):
        read_features(tmp_path / "f.npz", "intel5300")


# ----------------------------------------------------------------------------- preprocess


@pytest.mark.shared_data
def test_windows_of_intel_sample_have_the_right_shape() -> None:
    path = require_shared("csi-samples", "intel5300", "sample_0x1_ap.dat")
    rows, sel = capture_features(load_capture(path, "intel5300"))
    assert rows.shape == (540, 28 * 3 * 2)
    assert sel.index is not None
    assert 7 not in sel.index
    assert 21 not in sel.index
    assert make_windows(rows, 100).shape == (5, 100, 168)
    assert make_windows(rows, 100, 50).shape == (9, 100, 168)
    rows_p, _ = capture_features(load_capture(path, "intel5300"), phase=True)
    assert rows_p.shape == (540, 2 * 168)
    with pytest.raises(DataError, match="too few packets") as info:
        make_windows(rows, 1000, path=path)
    assert str(path) in str(info.value)


def test_user_subcarrier_positions(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(",".join(str(v) for v in range(10)) for _ in range(5)))
    cap = load_capture(path, "csv")
    rows, sel = capture_features(cap, subcarriers=[1, 3])
    assert rows.shape == (5, 2)
    assert sel.source == "user"
    with pytest.raises(DataError, match="position 10") as info:
        capture_features(cap, subcarriers=[10])
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("packets", "window", "stride"), [(100, 10, None), (105, 10, 5), (57, 7, 3), (20, 10, None)]
)
def test_time_split_never_shares_a_packet(packets: int, window: int, stride: int | None) -> None:
    train, test = split_windows_by_time(packets, window, stride, 0.2)
    assert len(test) >= 1
    train_packets = {int(s) + i for s in train for i in range(window)}
    test_packets = {int(s) + i for s in test for i in range(window)}
    assert not train_packets & test_packets
    assert max(train) < min(test)
    assert all(s + window <= packets for s in test)


def test_window_starts_and_single_window() -> None:
    assert window_starts(9, 10).size == 0
    train, test = split_windows_by_time(15, 10, None, 0.2)
    assert len(train) == 1
    assert len(test) == 0


def test_normalizer_fits_train_only() -> None:
    rng = np.random.default_rng(0)
    train = rng.normal(5.0, 2.0, size=(50, 10, 4)).astype(np.float32)
    test = rng.normal(100.0, 2.0, size=(5, 10, 4)).astype(np.float32)
    norm = Normalizer.fit(train)
    np.testing.assert_allclose(norm.apply(train).mean(axis=(0, 1)), 0.0, atol=1e-4)
    assert norm.apply(test).mean() > 10  # test statistics did not leak into the fit
    constant = Normalizer.fit(np.ones((3, 4), dtype=np.float32))
    assert np.isfinite(constant.apply(np.ones((2, 4), dtype=np.float32))).all()
    again = Normalizer.from_dict(norm.to_dict())
    np.testing.assert_allclose(again.apply(test), norm.apply(test))


def test_sanitize_phase_removes_linear_term() -> None:
    k = np.arange(-28, 29)
    csi = np.exp(1j * (0.3 * k + 1.0))[None, :].repeat(4, axis=0)
    np.testing.assert_allclose(sanitize_phase(csi, k), 0.0, atol=1e-5)
