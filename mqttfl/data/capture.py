"""Read raw Wi-Fi CSI capture files into complex arrays.

The vendor formats are parsed with csiread (the field's parser; its C readers work
under numpy 2).  csiread trusts the bytes it is given and can crash the whole
process (segfault) or silently return garbage when a file is not what the caller
claims, so every binary format is first walked record by record
(:mod:`mqttfl.data.capture_checks`) and rejected with a
:class:`~mqttfl.errors.DataError` naming the file when its structure does not match.
Nothing is printed: csiread's reports are switched off.

Formats (``fmt``) and what :func:`read_capture` returns, complex64 with packets first:

============  =========================================  ==============================
fmt           source                                      shape
============  =========================================  ==============================
intel5300     Linux 802.11n CSI Tool (csiread.Intel)      (packets, 30, rx, tx)
atheros       Atheros CSI Tool (csiread.Atheros)          (packets, tones, rx, tx)
nexmon        nexmon_csi pcap (csiread.Nexmon)            (packets, nfft) 64/128/256
esp32         ESP32-CSI-Tool CSV (csiread.ESP32 or the    (packets, values/2)
              tolerant reader in capture_esp32)
npz           ``csi_data`` array (ESPectre: int8          (packets, 64) for ESP int8
              (packets, 128) interleaved I/Q)             else csi_data's own shape
csv           rows of numbers (real-valued CSI)           (packets, columns)
============  =========================================  ==============================

:func:`load_capture` returns the same array plus what the parser knows about the
subcarrier axis (frequency index of each position, the PHY it was measured on),
which :mod:`mqttfl.data.preprocess` uses to drop null and pilot subcarriers.

Subcarrier order.  Intel 5300 reports 30 grouped subcarriers in ascending order,
Atheros its tones in ascending order.  Nexmon and the ESP32 family are returned in
FFT order (position ``p`` holds subcarrier ``p`` for ``p < N/2`` and ``p - N``
above), which is how nexmon_csi and ESP-IDF report them by default.  Two sources
report the 64 ESP bins centred instead (-32..31) and are rotated into FFT order on
reading: ESP32-CSI-Tool rows whose ``secondary_channel`` is not 0 (the sample
``example_csi.csv``, an HT40 capture, shows guards at both ends and DC in the middle)
and the ESP32-C5/C6 recordings of ESPectre (their all-zero bins sit at -32..-29, 0
and 29..31 in centred order, while the C3, S3 and ESP32 recordings show the same
bins in FFT order).

ESP32 I/Q order: ESP-IDF stores each subcarrier as two int8, imaginary part first;
both ``esp32`` and ``npz`` int8 data are decoded that way (as csiread does).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.capture_checks import (
    check_paths as check_paths,  # re-exported: inputs are checked before parsing
)
from mqttfl.data.capture_checks import (
    checked_csi,
    not_format_error,
    read_capture_bytes,
    walk_atheros,
    walk_intel5300,
    walk_nexmon_pcap,
)
from mqttfl.data.capture_esp32 import esp_iq_to_complex, parse_esp32_csv_tolerant
from mqttfl.data.capture_files import npz_features, open_npz, read_numeric_csv, scalar_str
from mqttfl.errors import DataError

NEXMON_CHIPS: tuple[str, ...] = ("4339", "43455c0", "4358", "4366c0")
NEXMON_BANDWIDTHS: tuple[int, ...] = (20, 40, 80)
# Chips whose 64 CSI bins arrive centred (-32..31) rather than in FFT order.
ESP_CENTRED_CHIPS: frozenset[str] = frozenset({"c5", "c6"})


@dataclass(frozen=True, eq=False)
class Capture:
    """One parsed capture file.

    ``csi`` is complex64, packets first, subcarriers second, antenna axes after.
    ``subcarrier_index`` gives the OFDM subcarrier index (relative to DC) of each
    position on axis 1, or None when the layout is unknown (generic npz/csv).
    ``phy`` names the subcarrier plan the CSI was measured on (``legacy20``,
    ``ht20``, ``ht40``, ``vht80``) or is None; ``invalid_index`` lists subcarrier
    indices the hardware is known to report as garbage.
    """

    path: Path
    fmt: str
    csi: np.ndarray
    subcarrier_index: np.ndarray | None = None
    phy: str | None = None
    bandwidth: int | None = None
    device: str = ""
    invalid_index: tuple[int, ...] = ()
    info: dict[str, object] = field(default_factory=dict)

    @property
    def num_packets(self) -> int:
        return int(self.csi.shape[0])

    @property
    def num_subcarriers(self) -> int:
        return int(self.csi.shape[1])


# ----------------------------------------------------------------------------- helpers


def fft_order_index(n: int) -> np.ndarray:
    """Subcarrier index of each position for ``n`` bins in FFT order (DC first)."""
    k = np.arange(n)
    return np.where(k < n // 2, k, k - n).astype(np.int64)


def _quietly(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------- intel5300

# Subcarrier grouping of the Intel 5300 (802.11n-2016 Table 9-54, Ng = 2 at 20 MHz,
# Ng = 4 at 40 MHz); csiread.utils.scidx gives the same lists.
INTEL5300_INDEX_20 = np.array(
    [-28, -26, -24, -22, -20, -18, -16, -14, -12, -10, -8, -6, -4, -2, -1,
     1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 28], dtype=np.int64,
)  # fmt: skip
INTEL5300_INDEX_40 = np.array(
    [-58, -54, -50, -46, -42, -38, -34, -30, -26, -22, -18, -14, -10, -6, -2,
     2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58], dtype=np.int64,
)  # fmt: skip


def _load_intel(path: Path) -> Capture:
    import csiread

    data = read_capture_bytes(path)
    _, _max_rx, max_tx = walk_intel5300(path, data)
    reader = csiread.Intel(str(path), nrxnum=3, ntxnum=max(2, max_tx), if_report=False)
    _quietly(reader.read)
    csi = checked_csi(path, reader.csi, "intel5300")
    ht40 = (np.asarray(reader.rate) & 0x800) != 0
    if ht40.any() and not ht40.all():
        raise DataError(path, "mixes 20 MHz and 40 MHz packets; split the capture first")
    bw = 40 if ht40.all() else 20
    index = INTEL5300_INDEX_40 if bw == 40 else INTEL5300_INDEX_20
    return Capture(
        path=path,
        fmt="intel5300",
        csi=csi,
        subcarrier_index=index.copy(),
        phy="ht40" if bw == 40 else "ht20",
        bandwidth=bw,
        device="intel5300",
        info={
            "ntx": sorted({int(v) for v in np.unique(reader.Ntx)}),
            "nrx": sorted({int(v) for v in np.unique(reader.Nrx)}),
        },
    )


# ----------------------------------------------------------------------------- atheros


def _load_atheros(path: Path) -> Capture:
    import csiread

    data = read_capture_bytes(path)
    truncated: DataError | None = None
    for endian in ("little", "big"):
        try:
            walked = walk_atheros(path, data, endian)
        except DataError as exc:  # truncated in this byte order; the other may fit whole
            truncated, walked = truncated or exc, None
        if walked is not None:
            break
    else:
        if truncated is not None:
            raise truncated
        raise not_format_error(
            path, "atheros", "record lengths do not match the Atheros CSI Tool log"
        )
    n, max_nr, max_nc, tones = walked
    reader = csiread.Atheros(
        str(path), nrxnum=max(3, max_nr), ntxnum=max(2, max_nc), tones=tones, if_report=False
    )
    _quietly(reader.read, endian)
    csi = checked_csi(path, reader.csi, "atheros")
    if tones == 56:
        index = np.r_[np.arange(-28, 0), np.arange(1, 29)].astype(np.int64)
        phy, bw = "ht20", 20
    else:
        index = np.r_[np.arange(-58, -1), np.arange(2, 59)].astype(np.int64)
        phy, bw = "ht40", 40
    return Capture(
        path=path,
        fmt="atheros",
        csi=csi,
        subcarrier_index=index,
        phy=phy,
        bandwidth=bw,
        device="atheros",
        info={"endian": endian, "records": n},
    )


# ----------------------------------------------------------------------------- nexmon


def _load_nexmon(path: Path, chip: str | None, bw: int | None) -> Capture:
    import csiread

    if chip is None or bw is None:
        raise DataError(
            path, "nexmon captures need the chip and bandwidth (--nexmon-chip, --nexmon-bw)"
        )
    chip = str(chip).lower().removeprefix("bcm")
    if chip not in NEXMON_CHIPS:
        raise DataError(path, f"unknown nexmon chip {chip!r}; one of {', '.join(NEXMON_CHIPS)}")
    try:
        bw = int(bw)
    except (TypeError, ValueError):
        bw = -1
    if bw not in NEXMON_BANDWIDTHS:
        raise DataError(path, f"nexmon bandwidth must be one of {NEXMON_BANDWIDTHS} MHz")
    nfft = int(3.2 * bw)
    data = read_capture_bytes(path)
    walk_nexmon_pcap(path, data, nfft)
    reader = csiread.Nexmon(str(path), chip=chip, bw=bw, if_report=False)
    try:
        _quietly(reader.read)
    except Exception as exc:  # csiread raises bare Exception for bad pcaps
        raise not_format_error(path, "nexmon", str(exc)) from None
    csi = checked_csi(path, reader.csi, "nexmon")
    phy = {20: "ht20", 40: "ht40", 80: "vht80"}[bw]
    return Capture(
        path=path,
        fmt="nexmon",
        csi=csi,
        subcarrier_index=fft_order_index(csi.shape[1]),
        phy=phy,
        bandwidth=bw,
        device=f"nexmon:{chip}",
        info={
            "cores": sorted(int(c) for c in np.unique(reader.core)),
            "spatial_streams": sorted(int(s) for s in np.unique(reader.spatial)),
        },
    )


# ----------------------------------------------------------------------------- esp32 CSV


def _load_esp32(path: Path) -> Capture:
    data = read_capture_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise not_format_error(path, "esp32", "binary data, expected a CSV text file") from None
    parser = "csiread"
    try:
        # csiread comes with the [capture] extra; without it (a sensing device's base
        # install) the tolerant parser reads the file, as it does when csiread refuses one
        import csiread

        reader = csiread.ESP32(str(path), if_report=False)
        _quietly(reader.read)
        csi = np.asarray(reader.csi)
        secondary = np.asarray(reader.secondary_channel, dtype=np.int64)
        macs = list(reader.mac)
        if csi.ndim != 2 or csi.shape[0] == 0 or not all(str(t) == "CSI_DATA" for t in reader.type):
            raise ValueError("not a plain ESP32-CSI-Tool file")
    except Exception:
        # csiread expects every line to be a CSI_DATA row; a header row (the PASSIVE
        # sample) or console chatter makes numpy refuse the joined string.
        raw, secondary, macs = parse_esp32_csv_tolerant(path, text)
        csi = esp_iq_to_complex(raw)
        parser = "tolerant"
    csi = checked_csi(path, csi, "esp32")
    n = csi.shape[1]
    centred = secondary != 0
    if centred.any():
        csi = csi.copy()
        csi[centred] = np.fft.ifftshift(csi[centred], axes=1)
    index = fft_order_index(n) if n == 64 else None
    unique_macs = sorted(set(macs))
    return Capture(
        path=path,
        fmt="esp32",
        csi=np.ascontiguousarray(csi),
        subcarrier_index=index,
        phy="legacy20" if n == 64 else None,
        bandwidth=20 if n == 64 else None,
        device="esp32" + (f":{unique_macs[0]}" if len(unique_macs) == 1 else ""),
        # ESP32 flags the first 32-bit word (DC and subcarrier +1) invalid
        # (ESP-IDF wifi_csi_info_t.first_word_invalid); the PASSIVE sample shows a
        # constant value there.
        invalid_index=(0, 1) if n == 64 else (),
        info={"parser": parser, "centred_rows": int(centred.sum())},
    )


# ----------------------------------------------------------------------------- npz / csv


def _load_npz(path: Path) -> Capture:
    arrays = open_npz(path)
    if "csi_data" not in arrays:
        keys = ", ".join(sorted(arrays)) or "none"
        raise DataError(path, f"no 'csi_data' array (keys: {keys})")
    raw = arrays["csi_data"]
    chip = (scalar_str(arrays, "chip") or "").lower()
    if raw.ndim < 2 or raw.shape[0] == 0:
        raise DataError(path, f"csi_data has shape {raw.shape}, expected (packets, subcarriers...)")
    if np.issubdtype(raw.dtype, np.complexfloating):
        csi = raw
        kind = "complex"
    elif np.issubdtype(raw.dtype, np.integer) and raw.ndim == 2 and raw.shape[1] % 2 == 0:
        csi = esp_iq_to_complex(raw)  # ESPectre / ESP-IDF: int8 interleaved I/Q
        kind = "esp-iq"
    elif np.issubdtype(raw.dtype, np.number) and not np.issubdtype(raw.dtype, np.bool_):
        csi = raw.astype(np.float32)
        kind = "real"
    else:
        raise DataError(path, f"csi_data has unsupported dtype {raw.dtype}")
    csi = checked_csi(path, csi, "npz")
    index, phy = None, None
    invalid: tuple[int, ...] = ()
    if kind == "esp-iq" and csi.shape[1] == 64:
        if chip in ESP_CENTRED_CHIPS:
            csi = np.ascontiguousarray(np.fft.ifftshift(csi, axes=1))
        index, phy, invalid = fft_order_index(64), "ht20", (0, 1)
    return Capture(
        path=path,
        fmt="npz",
        csi=csi,
        subcarrier_index=index,
        phy=phy,
        bandwidth=20 if phy else None,
        device=f"esp32:{chip}" if chip else "npz",
        invalid_index=invalid,
        info={"kind": kind, "label": scalar_str(arrays, "label"), "chip": chip or None},
    )


def _load_csv(path: Path) -> Capture:
    csi = checked_csi(path, read_numeric_csv(path), "csv")
    return Capture(path=path, fmt="csv", csi=csi, device="csv", info={"kind": "real"})


# ----------------------------------------------------------------------------- formats

#: (path, nexmon chip, nexmon bandwidth) -> the parsed capture
Loader = Callable[[Path, str | None, int | None], Capture]


def _path_only(load: Callable[[Path], Capture]) -> Loader:
    """A loader that needs no nexmon settings."""
    return lambda path, chip, bw: load(path)


@dataclass(frozen=True)
class CaptureFormat:
    """One ``fmt`` of :func:`load_capture`: adding a format is one entry below."""

    name: str
    load: Loader
    #: reads 1-D feature vectors, one sample per row; None: the format holds none
    features: Callable[[Path], np.ndarray] | None = None
    #: bits of the signed integers the radio reports each I and Q in; None: not I/Q
    iq_bits: int | None = None

    @property
    def iq_range(self) -> tuple[int, int] | None:
        """The smallest and largest I or Q value the format's radio reports."""
        if self.iq_bits is None:
            return None
        return -(2 ** (self.iq_bits - 1)), 2 ** (self.iq_bits - 1) - 1


# I/Q widths: the Linux 802.11n CSI Tool's and ESP-IDF's int8, the Atheros CSI Tool's
# 10 bits, nexmon_csi's int16 (npz and csv hold whatever was saved in them).
_FORMATS = (
    CaptureFormat("intel5300", _path_only(_load_intel), iq_bits=8),
    CaptureFormat("atheros", _path_only(_load_atheros), iq_bits=10),
    CaptureFormat("nexmon", _load_nexmon, iq_bits=16),
    CaptureFormat("esp32", _path_only(_load_esp32), iq_bits=8),
    CaptureFormat("npz", _path_only(_load_npz), features=npz_features),
    CaptureFormat("csv", _path_only(_load_csv), features=read_numeric_csv),
)
#: fmt -> its entry, in the order ``data prepare --format`` lists them
CAPTURE_FORMATS: Mapping[str, CaptureFormat] = {f.name: f for f in _FORMATS}
FORMATS: tuple[str, ...] = tuple(CAPTURE_FORMATS)


# ----------------------------------------------------------------------------- public


def load_capture(
    path: str | Path,
    fmt: str,
    *,
    nexmon_chip: str | None = None,
    nexmon_bw: int | None = None,
) -> Capture:
    """Parse ``path`` as ``fmt`` and return the CSI with its subcarrier layout.

    Raises :class:`DataError` naming the file when it is missing, unreadable, empty,
    or not a ``fmt`` capture.
    """
    path = Path(path)
    spec = CAPTURE_FORMATS.get(fmt)
    if spec is None:
        raise DataError(path, f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    return spec.load(path, nexmon_chip, nexmon_bw)


def read_capture(
    path: str | Path,
    fmt: str,
    *,
    nexmon_chip: str | None = None,
    nexmon_bw: int | None = None,
) -> np.ndarray:
    """Parse a capture file into complex64 CSI of shape (packets, subcarriers[, rx, tx]).

    See the module docstring for the per-format shapes and subcarrier order.
    """
    return load_capture(path, fmt, nexmon_chip=nexmon_chip, nexmon_bw=nexmon_bw).csi


def read_features(path: str | Path, fmt: str) -> np.ndarray:
    """Read 1-D feature vectors, one sample per row: float32 (n, F).

    ``npz``: the first 2-D real array among the keys ``x``, ``features``, ``csi_data``;
    ``csv``: rows of numbers (an optional header row is skipped).
    """
    path = Path(path)
    spec = CAPTURE_FORMATS.get(fmt)
    if spec is None or spec.features is None:
        raise DataError(path, f"feature vectors come from npz or csv files, not {fmt}")
    out = spec.features(path)
    if out.shape[0] == 0 or out.shape[1] == 0:
        raise DataError(path, "no feature rows found")
    out = out.astype(np.float32)
    if not np.isfinite(out).all():
        raise DataError(path, "contains NaN or infinite values")
    return out
