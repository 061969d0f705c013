"""Structure checks that run before a capture file reaches csiread, and after it.

csiread trusts the bytes it is given and can crash the whole process (segfault) or
silently return garbage when a file is not what the caller claims.  So
:mod:`mqttfl.data.capture` reads each file with :func:`read_capture_bytes`, walks the
binary formats record by record here (``walk_*``) and rejects a file whose structure
does not match with a :class:`~mqttfl.errors.DataError` naming it; what csiread
returns is then checked by :func:`checked_csi`.  :func:`check_paths` checks a list of
input files up front.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from mqttfl.errors import DataError

_INTEL_BFEE = 0xBB
_NEXMON_PORT = 5500
_NEXMON_HEADER = 14 + 20 + 8 + 18  # ethernet + IPv4 + UDP + nexmon_csi header
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": "<",
    b"\xa1\xb2\xc3\xd4": ">",
    b"\x4d\x3c\xb2\xa1": "<",
    b"\xa1\xb2\x3c\x4d": ">",
}


# ----------------------------------------------------------------------------- files


def read_capture_bytes(path: Path) -> bytes:
    """The file's bytes; DataError when it is missing, a directory, unreadable or empty."""
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


def not_format_error(path: Path, fmt: str, detail: str) -> DataError:
    """The error for a file whose content does not match the format it was given as."""
    return DataError(path, f"not a valid {fmt} capture ({detail}); check --format")


def checked_csi(path: Path, csi: np.ndarray, fmt: str) -> np.ndarray:
    """Parsed CSI as contiguous complex64 (packets first); DataError if empty or not finite."""
    csi = np.asarray(csi)
    if csi.ndim < 2 or csi.shape[0] == 0 or csi.shape[1] == 0:
        raise DataError(path, f"no CSI packets found in this {fmt} file")
    out = csi.astype(np.complex64, copy=False)
    if not np.isfinite(out.view(np.float32)).all():
        raise DataError(path, "CSI contains NaN or infinite values")
    return np.ascontiguousarray(out)


def check_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Resolve input paths, failing on the first missing one."""
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise DataError(path, "file not found" if not path.exists() else "not a regular file")
        out.append(path)
    return out


# ----------------------------------------------------------------------------- intel5300


def walk_intel5300(path: Path, data: bytes) -> tuple[int, int, int]:
    """Check the record structure; return (bfee records, max Nrx, max Ntx)."""
    pos, n, size = 0, 0, len(data)
    max_rx = max_tx = 0
    while pos + 3 <= size:
        field_len = int.from_bytes(data[pos : pos + 2], "big")
        code = data[pos + 2]
        end = pos + 2 + field_len
        if field_len < 1:
            raise not_format_error(path, "intel5300", f"zero-length record at byte {pos}")
        if end > size:
            break  # a truncated last record, as when logging was interrupted
        if code == _INTEL_BFEE:
            body = data[pos + 3 : end]
            if len(body) < 20:
                raise not_format_error(path, "intel5300", f"short CSI record at byte {pos}")
            nrx, ntx = body[8], body[9]
            csi_len = body[16] | (body[17] << 8)
            expected = (30 * (nrx * ntx * 8 * 2 + 3) + 7) // 8
            if not (1 <= nrx <= 3 and 1 <= ntx <= 3) or csi_len != expected:
                raise not_format_error(path, "intel5300", f"inconsistent CSI record at byte {pos}")
            if len(body) < 20 + csi_len:
                raise not_format_error(path, "intel5300", f"short CSI record at byte {pos}")
            n += 1
            max_rx, max_tx = max(max_rx, nrx), max(max_tx, ntx)
        elif code != 0xC1:
            raise not_format_error(
                path, "intel5300", f"unknown record code {code:#x} at byte {pos}"
            )
        pos = end
    if n == 0:
        raise not_format_error(path, "intel5300", "no CSI records")
    return n, max_rx, max_tx


# ----------------------------------------------------------------------------- atheros

_ATH_HEADER = 25


def walk_atheros(path: Path, data: bytes, endian: str) -> tuple[int, int, int, int] | None:
    """Return (records with CSI, max nr, max nc, tones) or None if not this layout.

    A file whose records match the layout but whose last record is cut short (a
    capture copied while it was written, a partial download) raises :class:`DataError`
    naming the byte offset of that record: csiread would silently drop it.
    """
    pos, n, size = 0, 0, len(data)
    max_nr = max_nc = 0
    tones_seen: set[int] = set()
    order: Literal["little", "big"] = "little" if endian == "little" else "big"
    while pos + 2 <= size:
        field_len = int.from_bytes(data[pos : pos + 2], order)
        end = pos + 2 + field_len
        if end > size:
            if n == 0:
                return None
            raise DataError(
                path,
                f"truncated Atheros record at byte {pos}: it declares {field_len} bytes "
                f"after its 2-byte length, the file ends {size - pos - 2} bytes later",
            )
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
    if pos != size:  # a single byte left: not even a record length
        raise DataError(path, f"truncated Atheros record at byte {pos}: 1 byte, no length")
    return n, max_nr, max_nc, tones_seen.pop()


# ----------------------------------------------------------------------------- nexmon


def walk_nexmon_pcap(path: Path, data: bytes, nfft: int) -> int:
    """Check every packet is a nexmon_csi UDP packet large enough for ``nfft`` bins."""
    if len(data) < 24:
        raise not_format_error(path, "nexmon", "shorter than a pcap header")
    endian = _PCAP_MAGICS.get(data[:4])
    if endian is None:
        raise not_format_error(path, "nexmon", "not a pcap file")
    pos, n, size = 24, 0, len(data)
    available: set[int] = set()
    while pos + 16 <= size:
        _, _, incl_len, _ = struct.unpack(endian + "IIII", data[pos : pos + 16])
        start, end = pos + 16, pos + 16 + incl_len
        if end > size:
            break  # truncated tail
        pkt = data[start:end]
        if len(pkt) < _NEXMON_HEADER or int.from_bytes(pkt[36:38], "big") != _NEXMON_PORT:
            raise not_format_error(
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
            f"packets carry {found} but the bandwidth given needs {nfft}; check --nexmon-bw",
        )
    return n
