"""A gateway's CSI frames on ``mqtt:TOPIC``: one packet per MQTT message.

A message is either

* one ESP32-CSI-Tool line, text starting with ``CSI_DATA,`` whose ``[...]`` array holds
  the ESP's int8 I/Q buffer (what the ESP32 prints on its serial port, forwarded as is);
  or
* one msgpack map ``{"csi": <I/Q>, "t": <seconds since the epoch, optional>}``, where
  ``<I/Q>`` is the same buffer as bytes (int8) or as an array of numbers, imaginary part
  first for each subcarrier as ESP-IDF stores it.

Both decode as ``mqttfl data prepare --format esp32`` / ``--format npz`` decode ESP data
(:func:`mqttfl.data.capture_esp32.esp_iq_to_complex`), rotated into FFT order where the
ESP reports the bins centred. A frame that is not one of these, has another subcarrier
count than the model reads, holds NaN, or holds a value its radio cannot report raises
:class:`FrameError`: the sensing loop drops it, counts it and goes on. The radio is the
one the model's captures came from (``preprocess.capture_format``: int8 for the ESP32
family and the Intel 5300, 10 bits for Atheros, int16 for nexmon), else the ESP's int8
this frame format carries: a value of 1e8 is no reading of any room, only a way to drag
the adapting sensor's statistics.

``t`` is only checked to be a finite number here; whether it is a plausible time is the
sensing loop's call (:func:`mqttfl.sensing.gateway.frame_time`).
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np

from mqttfl.data.capture import CAPTURE_FORMATS
from mqttfl.data.capture_esp32 import esp_iq_to_complex, parse_esp32_csv_tolerant
from mqttfl.errors import DataError, FrameError
from mqttfl.sensing.spec import Preprocess

MAX_FRAME_BYTES = 64 * 1024  # an ESP frame is a few hundred bytes
ESP_IQ_RANGE = (-128, 127)  # the int8 of the ESP's buffer, which this frame format carries


def iq_range(pre: Preprocess) -> tuple[int, int]:
    """The I/Q values a frame for this model may hold (module docstring)."""
    fmt = CAPTURE_FORMATS.get(pre.capture_format or "")
    own = None if fmt is None else fmt.iq_range
    return ESP_IQ_RANGE if own is None else own


def _iq_values(value: object) -> np.ndarray:
    if isinstance(value, bytes | bytearray):
        return np.frombuffer(bytes(value), dtype=np.int8).astype(np.float64)
    if isinstance(value, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        return np.asarray(value, dtype=np.float64)
    raise FrameError("malformed", "'csi' must be bytes or an array of numbers")


def decode_frame(payload: bytes, pre: Preprocess) -> tuple[np.ndarray, float | None]:
    """One frame as complex CSI (subcarriers,) in FFT order, and its time if it has one."""
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError("too_large", f"{len(payload)} bytes, more than {MAX_FRAME_BYTES}")
    stamp: float | None = None
    secondary = 0
    if payload.startswith(b"CSI_DATA"):
        try:
            text = payload.decode("utf-8")
            raw, sec, _ = parse_esp32_csv_tolerant(Path("frame"), text)
        except (UnicodeDecodeError, DataError) as exc:
            raise FrameError("malformed", f"not an ESP32 CSI line ({exc})") from None
        if len(raw) != 1:
            raise FrameError("malformed", f"{len(raw)} CSI_DATA lines in one message, expected 1")
        values = raw[0].astype(np.float64)
        secondary = int(sec[0])
    else:
        try:
            frame = msgpack.unpackb(
                payload, raw=False, strict_map_key=True, max_bin_len=MAX_FRAME_BYTES
            )
        except Exception as exc:
            raise FrameError(
                "malformed", f"neither an ESP32 CSI line nor msgpack ({type(exc).__name__})"
            ) from None
        if not isinstance(frame, dict) or "csi" not in frame:
            raise FrameError("malformed", "a msgpack frame must be a map with a 'csi' entry")
        values = _iq_values(frame["csi"])
        t = frame.get("t")
        if t is not None:
            if not isinstance(t, int | float) or isinstance(t, bool) or not np.isfinite(t):
                raise FrameError("malformed", f"'t' must be a finite number, got {t!r:.40}")
            stamp = float(t)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise FrameError(
            "nan",
            f"NaN or infinite value at I/Q position {int(bad[0])} (subcarrier {int(bad[0]) // 2})",
        )
    low, high = iq_range(pre)
    outside = np.flatnonzero((values < low) | (values > high))
    if outside.size:
        i = int(outside[0])
        raise FrameError(
            "range",
            f"I/Q value {values[i]:.6g} at position {i} (subcarrier {i // 2}) is outside "
            f"{low}..{high}, what the radio reports",
        )
    if values.size == 0 or values.size % 2:
        raise FrameError("shape", f"{values.size} I/Q values, expected an even, non-zero count")
    subcarriers = values.size // 2
    expected = pre.raw_subcarriers
    if expected is not None and subcarriers != expected:
        raise FrameError(
            "shape",
            f"{subcarriers} subcarriers ({values.size} I/Q values), the model reads "
            f"{expected} (sensor.json preprocess.subcarriers.raw_count)",
        )
    if pre.positions is not None and subcarriers <= max(pre.positions):
        raise FrameError(
            "shape", f"{subcarriers} subcarriers, the model reads position {max(pre.positions)}"
        )
    csi = esp_iq_to_complex(values[None])[0].astype(np.complex64)
    if secondary != 0 or pre.esp_centred:
        csi = np.fft.ifftshift(csi)
    return csi, stamp
