"""ESP32 CSI values: the tolerant ESP32-CSI-Tool CSV reader and the ESP I/Q order.

csiread's ESP32 reader expects every line to be a ``CSI_DATA`` row; a header row (the
PASSIVE sample) or serial-console chatter makes it fail, and
:func:`mqttfl.data.capture.load_capture` then falls back to
:func:`parse_esp32_csv_tolerant`.  ESP-IDF stores each subcarrier as two int8,
imaginary part first; :func:`esp_iq_to_complex` decodes that order (as csiread does)
for both ``esp32`` CSV files and ``npz`` int8 data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mqttfl.errors import DataError

ESP32_CSV_COLUMNS = (
    "type", "role", "mac", "rssi", "rate", "sig_mode", "mcs", "bandwidth", "smoothing",
    "not_sounding", "aggregation", "stbc", "fec_coding", "sgi", "noise_floor", "ampdu_cnt",
    "channel", "secondary_channel", "local_timestamp", "ant", "sig_len", "rx_state",
    "real_time_set", "real_timestamp", "len", "CSI_DATA",
)  # fmt: skip


def parse_esp32_csv_tolerant(path: Path, text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Parse ESP32-CSI-Tool lines, with or without a header row and in any role.

    Lines that do not start with ``CSI_DATA`` (a header, serial-console chatter) are
    skipped; a ``CSI_DATA`` line that cannot be parsed is an error naming its line.
    Returns (raw int values (rows, 2*subcarriers), secondary_channel per row, macs).
    """
    rows: list[list[int]] = []
    secondary: list[int] = []
    macs: list[str] = []
    sec_col = ESP32_CSV_COLUMNS.index("secondary_channel")
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


def esp_iq_to_complex(raw: np.ndarray) -> np.ndarray:
    """Interleaved ESP int8 pairs (imaginary, real) -> complex."""
    raw = raw.astype(np.float32)
    return raw[:, 1::2] + 1j * raw[:, 0::2]
