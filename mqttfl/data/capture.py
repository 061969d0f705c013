"""Read raw Wi-Fi CSI capture files into complex arrays.

The vendor formats are parsed with csiread (the field's parser; its C readers work
under numpy 2).  csiread trusts the bytes it is given and can crash the whole
process (segfault) or silently return garbage when a file is not what the caller
claims, so every binary format is first walked record by record here and rejected
with a :class:`~mqttfl.errors.DataError` naming the file when its structure does not
match.  Nothing is printed: csiread's reports are switched off.

Formats (``fmt``) and what :func:`read_capture` returns, complex64 with packets first:

============  =========================================  ==============================
fmt           source                                      shape
============  =========================================  ==============================
intel5300     Linux 802.11n CSI Tool (csiread.Intel)      (packets, 30, rx, tx)
atheros       Atheros CSI Tool (csiread.Atheros)          (packets, tones, rx, tx)
nexmon        nexmon_csi pcap (csiread.Nexmon)            (packets, nfft) 64/128/256
esp32         ESP32-CSI-Tool CSV (csiread.ESP32 or the    (packets, values/2)
              tolerant reader below)
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

import csv
import io
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.errors import DataError

FORMATS: tuple[str, ...] = ("intel5300", "atheros", "nexmon", "esp32", "npz", "csv")
NEXMON_CHIPS: tuple[str, ...] = ("4339", "43455c0", "4358", "4366c0")
NEXMON_BANDWIDTHS: tuple[int, ...] = (20, 40, 80)
# Chips whose 64 CSI bins arrive centred (-32..31) rather than in FFT order.
ESP_CENTRED_CHIPS: frozenset[str] = frozenset({"c5", "c6"})

_INTEL_BFEE = 0xBB
_NEXMON_PORT = 5500
_NEXMON_HEADER = 14 + 20 + 8 + 18  # ethernet + IPv4 + UDP + nexmon_csi header
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": "<",
    b"\xa1\xb2\xc3\xd4": ">",
    b"\x4d\x3c\xb2\xa1": "<",
    b"\xa1\xb2\x3c\x4d": ">",
}


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
    info: dict[str, Any] = field(default_factory=dict)

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


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise DataError(path, "file not found")
    if path.is_dir():
        raise DataError(path, "is a directory, expected a capture file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(path, f"unreadable: {exc.strerror or exc}") from None
    if not data:
        raise DataError(path, "file is empty")
    return data


def _not_format(path: Path, fmt: str, detail: str) -> DataError:
    return DataError(path, f"not a valid {fmt} capture ({detail}); check --format")


def _finish(path: Path, csi: np.ndarray, fmt: str) -> np.ndarray:
    csi = np.asarray(csi)
    if csi.ndim < 2 or csi.shape[0] == 0 or csi.shape[1] == 0:
        raise DataError(path, f"no CSI packets found in this {fmt} file")
    out = csi.astype(np.complex64, copy=False)
    if not np.isfinite(out.view(np.float32)).all():
        raise DataError(path, "CSI contains NaN or infinite values")
    return np.ascontiguousarray(out)


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


def _walk_intel(path: Path, data: bytes) -> tuple[int, int, int]:
    """Check the record structure; return (bfee records, max Nrx, max Ntx)."""
    pos, n, size = 0, 0, len(data)
    max_rx = max_tx = 0
    while pos + 3 <= size:
        field_len = int.from_bytes(data[pos : pos + 2], "big")
        code = data[pos + 2]
        end = pos + 2 + field_len
        if field_len < 1:
            raise _not_format(path, "intel5300", f"zero-length record at byte {pos}")
        if end > size:
            break  # a truncated last record, as when logging was interrupted
        if code == _INTEL_BFEE:
            body = data[pos + 3 : end]
            if len(body) < 20:
                raise _not_format(path, "intel5300", f"short CSI record at byte {pos}")
            nrx, ntx = body[8], body[9]
            csi_len = body[16] | (body[17] << 8)
            expected = (30 * (nrx * ntx * 8 * 2 + 3) + 7) // 8
            if not (1 <= nrx <= 3 and 1 <= ntx <= 3) or csi_len != expected:
                raise _not_format(
                    path, "intel5300", f"inconsistent CSI record at byte {pos}"
                )
            if len(body) < 20 + csi_len:
                raise _not_format(path, "intel5300", f"short CSI record at byte {pos}")
            n += 1
            max_rx, max_tx = max(max_rx, nrx), max(max_tx, ntx)
        elif code != 0xC1:
            raise _not_format(path, "intel5300", f"unknown record code {code:#x} at byte {pos}")
        pos = end
    if n == 0:
        raise _not_format(path, "intel5300", "no CSI records")
    return n, max_rx, max_tx


def _load_intel(path: Path) -> Capture:
    import csiread

    data = _read_bytes(path)
    _, _max_rx, max_tx = _walk_intel(path, data)
    reader = csiread.Intel(str(path), nrxnum=3, ntxnum=max(2, max_tx), if_report=False)
    _quietly(reader.read)
    csi = _finish(path, reader.csi, "intel5300")
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
        info={"ntx": sorted({int(v) for v in np.unique(reader.Ntx)}),
              "nrx": sorted({int(v) for v in np.unique(reader.Nrx)})},
    )


# ----------------------------------------------------------------------------- atheros

_ATH_HEADER = 25


def _walk_atheros(path: Path, data: bytes, endian: str) -> tuple[int, int, int, int] | None:
    """Return (records with CSI, max nr, max nc, tones) or None if not this layout."""
    pos, n, size = 0, 0, len(data)
    max_nr = max_nc = 0
    tones_seen: set[int] = set()
    order = "little" if endian == "little" else "big"
    while pos + 2 <= size:
        field_len = int.from_bytes(data[pos : pos + 2], order)
        end = pos + 2 + field_len
        if end > size:
            if n == 0:
                return None
            break  # truncated tail
        if field_len < _ATH_HEADER:
            return None
        h = data[pos + 2 : pos + 2 + _ATH_HEADER]
        csi_len = int.from_bytes(h[8:10], order)
        tones, nr, nc = h[16], h[17], h[18]
        payload_len = int.from_bytes(h[23:25], order)
        if _ATH_HEADER + csi_len + payload_len != field_len:
            return None
        if csi_len:
            if tones not in (56, 114) or not (1 <= nr <= 3 and 1 <= nc <= 3):
                return None
            if csi_len != (nr * nc * tones * 20 + 7) // 8:
                return None
            n += 1
            max_nr, max_nc = max(max_nr, nr), max(max_nc, nc)
            tones_seen.add(tones)
        pos = end
    if n == 0 or len(tones_seen) != 1:
        return None
    return n, max_nr, max_nc, tones_seen.pop()


def _load_atheros(path: Path) -> Capture:
    import csiread

    data = _read_bytes(path)
    for endian in ("little", "big"):
        walked = _walk_atheros(path, data, endian)
        if walked is not None:
            break
    else:
        raise _not_format(path, "atheros", "record lengths do not match the Atheros CSI Tool log")
    n, max_nr, max_nc, tones = walked
    reader = csiread.Atheros(
        str(path), nrxnum=max(3, max_nr), ntxnum=max(2, max_nc), tones=tones, if_report=False
    )
    _quietly(reader.read, endian)
    csi = _finish(path, reader.csi, "atheros")
    if tones == 56:
        index = np.r_[np.arange(-28, 0), np.arange(1, 29)].astype(np.int64)
        phy, bw = "ht20", 20
    else:
        index = np.r_[np.arange(-58, -1), np.arange(2, 59)].astype(np.int64)
        phy, bw = "ht40", 40
    return Capture(
        path=path, fmt="atheros", csi=csi, subcarrier_index=index, phy=phy, bandwidth=bw,
        device="atheros", info={"endian": endian, "records": n},
    )


# ----------------------------------------------------------------------------- nexmon


def _walk_pcap(path: Path, data: bytes, nfft: int) -> int:
    """Check every packet is a nexmon_csi UDP packet large enough for ``nfft`` bins."""
    if len(data) < 24:
        raise _not_format(path, "nexmon", "shorter than a pcap header")
    endian = _PCAP_MAGICS.get(data[:4])
    if endian is None:
        raise _not_format(path, "nexmon", "not a pcap file")
    pos, n, size = 24, 0, len(data)
    available: set[int] = set()
    while pos + 16 <= size:
        _, _, incl_len, _ = struct.unpack(endian + "IIII", data[pos : pos + 16])
        start, end = pos + 16, pos + 16 + incl_len
        if end > size:
            break  # truncated tail
        pkt = data[start:end]
        if len(pkt) < _NEXMON_HEADER or int.from_bytes(pkt[36:38], "big") != _NEXMON_PORT:
            raise _not_format(
                path, "nexmon", f"packet {n + 1} is not a nexmon_csi UDP packet (port 5500)"
            )
        available.add((len(pkt) - _NEXMON_HEADER) // 4)
        n += 1
        pos = end
    if n == 0:
        raise DataError(path, "no CSI packets found in this nexmon file")
    fits = {max((b for b in (64, 128, 256) if b <= a), default=0) for a in available}
    if fits != {nfft}:
        found = ", ".join(f"{b} bins" for b in sorted(fits))
        raise DataError(
            path,
            f"packets carry {found} but the bandwidth given needs {nfft}; "
            "check --nexmon-bw",
        )
    return n


def _load_nexmon(path: Path, chip: str | None, bw: int | None) -> Capture:
    import csiread

    if chip is None or bw is None:
        raise DataError(path, "nexmon captures need the chip and bandwidth (--nexmon-chip, --nexmon-bw)")
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
    data = _read_bytes(path)
    _walk_pcap(path, data, nfft)
    reader = csiread.Nexmon(str(path), chip=chip, bw=bw, if_report=False)
    try:
        _quietly(reader.read)
    except Exception as exc:  # csiread raises bare Exception for bad pcaps
        raise _not_format(path, "nexmon", str(exc)) from None
    csi = _finish(path, reader.csi, "nexmon")
    phy = {20: "ht20", 40: "ht40", 80: "vht80"}[bw]
    return Capture(
        path=path, fmt="nexmon", csi=csi, subcarrier_index=fft_order_index(csi.shape[1]),
        phy=phy, bandwidth=bw, device=f"nexmon:{chip}",
        info={"cores": sorted(int(c) for c in np.unique(reader.core)),
              "spatial_streams": sorted(int(s) for s in np.unique(reader.spatial))},
    )


# ----------------------------------------------------------------------------- esp32 CSV

_ESP32_COLUMNS = (
    "type", "role", "mac", "rssi", "rate", "sig_mode", "mcs", "bandwidth", "smoothing",
    "not_sounding", "aggregation", "stbc", "fec_coding", "sgi", "noise_floor", "ampdu_cnt",
    "channel", "secondary_channel", "local_timestamp", "ant", "sig_len", "rx_state",
    "real_time_set", "real_timestamp", "len", "CSI_DATA",
)  # fmt: skip


def _parse_esp32_tolerant(path: Path, text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Parse ESP32-CSI-Tool lines, with or without a header row and in any role.

    Lines that do not start with ``CSI_DATA`` (a header, serial-console chatter) are
    skipped; a ``CSI_DATA`` line that cannot be parsed is an error naming its line.
    Returns (raw int values (rows, 2*subcarriers), secondary_channel per row, macs).
    """
    rows: list[list[int]] = []
    secondary: list[int] = []
    macs: list[str] = []
    sec_col = _ESP32_COLUMNS.index("secondary_channel")
    width: int | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line.startswith("CSI_DATA"):
            continue
        head, sep, tail = line.partition("[")
        if not sep or "]" not in tail:
            raise DataError(path, f"line {lineno}: CSI_DATA row without a [ ... ] CSI array")
        fields = head.rstrip(",").split(",")
        try:
            values = [int(v) for v in tail[: tail.index("]")].split()]
            sec = int(fields[sec_col]) if len(fields) > sec_col else 0
        except ValueError:
            raise DataError(path, f"line {lineno}: non-integer value in a CSI_DATA row") from None
        if not values or len(values) % 2:
            raise DataError(
                path, f"line {lineno}: CSI array has {len(values)} values, expected an even count"
            )
        if width is None:
            width = len(values)
        elif len(values) != width:
            raise DataError(
                path, f"line {lineno}: CSI array has {len(values)} values, earlier rows {width}"
            )
        rows.append(values)
        secondary.append(sec)
        macs.append(fields[2] if len(fields) > 2 else "")
    if not rows:
        raise DataError(path, "no CSI_DATA rows found; is this an ESP32-CSI-Tool CSV?")
    return np.asarray(rows, dtype=np.int64), np.asarray(secondary, dtype=np.int64), macs


def _esp_iq(raw: np.ndarray) -> np.ndarray:
    """Interleaved ESP int8 pairs (imaginary, real) -> complex."""
    raw = raw.astype(np.float32)
    return raw[:, 1::2] + 1j * raw[:, 0::2]


def _load_esp32(path: Path) -> Capture:
    import csiread

    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_format(path, "esp32", "binary data, expected a CSV text file") from None
    parser = "csiread"
    try:
        reader = csiread.ESP32(str(path), if_report=False)
        _quietly(reader.read)
        csi = np.asarray(reader.csi)
        secondary = np.asarray(reader.secondary_channel, dtype=np.int64)
        macs = list(reader.mac)
        if csi.ndim != 2 or csi.shape[0] == 0 or not all(str(t) == "CSI_DATA" for t in reader.type):
            raise ValueError("not a plain ESP32-CSI-Tool file")
    except Exception:  # noqa: BLE001 - any csiread failure falls back to the tolerant reader
        # csiread expects every line to be a CSI_DATA row; a header row (the PASSIVE
        # sample) or console chatter makes numpy refuse the joined string.
        raw, secondary, macs = _parse_esp32_tolerant(path, text)
        csi = _esp_iq(raw)
        parser = "tolerant"
    csi = _finish(path, csi, "esp32")
    n = csi.shape[1]
    centred = secondary != 0
    if centred.any():
        csi = csi.copy()
        csi[centred] = np.fft.ifftshift(csi[centred], axes=1)
    index = fft_order_index(n) if n == 64 else None
    unique_macs = sorted(set(macs))
    return Capture(
        path=path, fmt="esp32", csi=np.ascontiguousarray(csi), subcarrier_index=index,
        phy="legacy20" if n == 64 else None, bandwidth=20 if n == 64 else None,
        device="esp32" + (f":{unique_macs[0]}" if len(unique_macs) == 1 else ""),
        # ESP32 flags the first 32-bit word (DC and subcarrier +1) invalid
        # (ESP-IDF wifi_csi_info_t.first_word_invalid); the PASSIVE sample shows a
        # constant value there.
        invalid_index=(0, 1) if n == 64 else (),
        info={"parser": parser, "centred_rows": int(centred.sum())},
    )


# ----------------------------------------------------------------------------- npz / csv


def _open_npz(path: Path) -> dict[str, np.ndarray]:
    _read_bytes(path)  # existence / emptiness
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise DataError(path, "holds a single .npy array, expected an .npz archive")
            return {key: npz[key] for key in npz.files}
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile/pickle/format errors vary
        raise _not_format(path, "npz", f"unreadable archive: {type(exc).__name__}") from None


def _scalar_str(arrays: dict[str, np.ndarray], key: str) -> str | None:
    value = arrays.get(key)
    if value is None or value.ndim != 0:
        return None
    return str(value.item())


def _load_npz(path: Path) -> Capture:
    arrays = _open_npz(path)
    if "csi_data" not in arrays:
        keys = ", ".join(sorted(arrays)) or "none"
        raise DataError(path, f"no 'csi_data' array (keys: {keys})")
    raw = arrays["csi_data"]
    chip = (_scalar_str(arrays, "chip") or "").lower()
    if raw.ndim < 2 or raw.shape[0] == 0:
        raise DataError(path, f"csi_data has shape {raw.shape}, expected (packets, subcarriers...)")
    if np.issubdtype(raw.dtype, np.complexfloating):
        csi = raw
        kind = "complex"
    elif np.issubdtype(raw.dtype, np.integer) and raw.ndim == 2 and raw.shape[1] % 2 == 0:
        csi = _esp_iq(raw)  # ESPectre / ESP-IDF: int8 interleaved I/Q
        kind = "esp-iq"
    elif np.issubdtype(raw.dtype, np.number) and not np.issubdtype(raw.dtype, np.bool_):
        csi = raw.astype(np.float32)
        kind = "real"
    else:
        raise DataError(path, f"csi_data has unsupported dtype {raw.dtype}")
    csi = _finish(path, csi, "npz")
    index, phy, invalid = None, None, ()
    if kind == "esp-iq" and csi.shape[1] == 64:
        if chip in ESP_CENTRED_CHIPS:
            csi = np.ascontiguousarray(np.fft.ifftshift(csi, axes=1))
        index, phy, invalid = fft_order_index(64), "ht20", (0, 1)
    return Capture(
        path=path, fmt="npz", csi=csi, subcarrier_index=index, phy=phy,
        bandwidth=20 if phy else None, device=f"esp32:{chip}" if chip else "npz",
        invalid_index=invalid,
        info={"kind": kind, "label": _scalar_str(arrays, "label"), "chip": chip or None},
    )


def _read_numeric_csv(path: Path) -> np.ndarray:
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _not_format(path, "csv", "binary data, expected a CSV text file") from None
    rows: list[list[float]] = []
    width: int | None = None
    for lineno, cells in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in cells]
        if not any(cells):
            continue
        try:
            values = [float(c) for c in cells if c != ""]
        except ValueError:
            if not rows and lineno == 1:
                continue  # a header row
            hint = "; looks like an ESP32-CSI-Tool file, use --format esp32" if cells[0] == "CSI_DATA" else ""
            raise DataError(path, f"line {lineno}: not a row of numbers{hint}") from None
        if width is None:
            width = len(values)
        elif len(values) != width:
            raise DataError(path, f"line {lineno}: {len(values)} columns, earlier rows {width}")
        rows.append(values)
    if not rows or not width:
        raise DataError(path, "no numeric rows found")
    out = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(out).all():
        raise DataError(path, "contains NaN or infinite values")
    return out


def _load_csv(path: Path) -> Capture:
    csi = _finish(path, _read_numeric_csv(path), "csv")
    return Capture(path=path, fmt="csv", csi=csi, device="csv", info={"kind": "real"})


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
    if fmt not in FORMATS:
        raise DataError(path, f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "intel5300":
        return _load_intel(path)
    if fmt == "atheros":
        return _load_atheros(path)
    if fmt == "nexmon":
        return _load_nexmon(path, nexmon_chip, nexmon_bw)
    if fmt == "esp32":
        return _load_esp32(path)
    if fmt == "npz":
        return _load_npz(path)
    return _load_csv(path)


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
    if fmt == "csv":
        out = _read_numeric_csv(path)
    elif fmt == "npz":
        arrays = _open_npz(path)
        for key in ("x", "features", "csi_data"):
            if key in arrays:
                out = arrays[key]
                break
        else:
            keys = ", ".join(sorted(arrays)) or "none"
            raise DataError(path, f"no 'x', 'features' or 'csi_data' array (keys: {keys})")
        if out.ndim != 2 or not np.issubdtype(out.dtype, np.number) or np.iscomplexobj(out):
            raise DataError(path, f"feature array {key!r} must be real and 2-D, got {out.dtype} {out.shape}")
    else:
        raise DataError(path, f"feature vectors come from npz or csv files, not {fmt}")
    if out.shape[0] == 0 or out.shape[1] == 0:
        raise DataError(path, "no feature rows found")
    out = out.astype(np.float32)
    if not np.isfinite(out).all():
        raise DataError(path, "contains NaN or infinite values")
    return out


def check_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Resolve input paths, failing on the first missing one."""
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise DataError(path, "file not found" if not path.exists() else "not a regular file")
        out.append(path)
    return out
