"""The sensing pipeline cuts the windows the shards were built from: raw packets in,
the shard's normalized windows out, bit for bit (numpy only, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from mqttfl.data.capture import load_capture
from mqttfl.data.espectre import ESPECTRE_CHIPS, espectre_recordings, espectre_shard
from mqttfl.data.preprocess import split_windows_by_time
from mqttfl.errors import FrameError
from mqttfl.export.sensor import preprocess_from_shard
from mqttfl.sensing.frames import decode_frame
from mqttfl.sensing.pipeline import Windower, capture_rows
from mqttfl.sensing.spec import Preprocess
from tests._shared_data import require_shared


@pytest.mark.parametrize("client", [1, 3])  # C5 (bins reported centred) and the ESP32
def test_espectre_recordings_replayed_give_the_shards_test_windows(client: int) -> None:
    root = require_shared("espectre")
    window, stride = 50, 25
    shard = espectre_shard(client, root=root, window=window, stride=stride)
    pre = preprocess_from_shard(shard, where="test")
    assert pre.raw_subcarriers == 64
    assert len(pre.positions or ()) == 51
    assert pre.esp_centred == (ESPECTRE_CHIPS[client] in ("c5", "c6"))
    assert pre.sample_rate_hz is not None
    assert 90 < pre.sample_rate_hz < 140
    expected = []
    labelled = [r for r in espectre_recordings(root)[ESPECTRE_CHIPS[client]] if r.kind != "test"]
    # the shard orders its recordings (its sessions) by their time stamps
    for rec in sorted(labelled, key=lambda r: r.path.name.split("_", 1)[-1]):
        rows = capture_rows(load_capture(rec.path, "npz"), pre)
        windower = Windower(pre)
        windows = [w.x for row in rows if (w := windower.push(row, 0.0)) is not None]
        _, test_starts = split_windows_by_time(len(rows), window, stride, 0.2)
        expected.extend(windows[len(windows) - len(test_starts) :])
    np.testing.assert_array_equal(np.stack(expected), shard.x_test)


def _pre(window: int, stride: int) -> Preprocess:
    return Preprocess(
        kind="csi-windows",
        window=window,
        stride=stride,
        features=2,
        positions=(0, 1),
        raw_subcarriers=2,
        subcarrier_index=None,
    )


@pytest.mark.parametrize(("window", "stride"), [(4, 4), (4, 2), (3, 5)])
def test_windows_start_every_stride_packets(window: int, stride: int) -> None:
    windower = Windower(_pre(window, stride))
    starts = [
        int(w.x[0, 0])
        for i in range(20)
        if (w := windower.push(np.array([i, -i], np.float32), float(i))) is not None
    ]
    assert starts == list(range(0, 20 - window + 1, stride))


def test_an_esp_line_and_a_msgpack_frame_decode_to_the_same_packet() -> None:
    import msgpack

    pre = Preprocess("csi-windows", 1, 1, 4, (0, 1, 2, 3), 4, None)
    iq = [1, 2, -3, 4, 5, -6, 7, 8]  # imaginary first, as ESP-IDF stores it
    line = (
        "CSI_DATA,STA,aa:bb,-50,11,1,0,0,1,1,0,0,0,0,-90,0,6,0,0,0,0,0,0,0,8,["
        + " ".join(map(str, iq))
        + "]"
    ).encode()
    from_line, _ = decode_frame(line, pre)
    from_bytes, _ = decode_frame(msgpack.packb({"csi": np.array(iq, np.int8).tobytes()}), pre)
    np.testing.assert_array_equal(
        from_line, np.array([2 + 1j, 4 - 3j, -6 + 5j, 8 + 7j], np.complex64)
    )
    np.testing.assert_array_equal(from_bytes, from_line)
    with pytest.raises(FrameError, match="'t' must be a finite number"):
        decode_frame(msgpack.packb({"csi": iq, "t": float("inf")}), pre)
