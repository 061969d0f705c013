"""The coordinator's upload gate: each hostile upload is rejected with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context
from mqttfl.algorithms.fedapa import FedAPAParams
from mqttfl.engine.gate import UploadGate
from mqttfl.errors import RejectedUpload
from mqttfl.wire import Message, encode
from mqttfl.wire.schemas import ClientInfo

CTX = Context(num_classes=21, embed_dim=8, rounds=5, seed=0, params=FedAPAParams())
INFO = {c: ClientInfo(c, "tiny", (0, 1), 40, (16, 16)) for c in ("1", "2", "3")}


def _gate() -> UploadGate:
    gate = UploadGate(get_algorithm("fedapa"), CTX, "run", max_bytes=100_000)
    gate.open_round(3, ["1", "2"], keep=False)
    return gate


def _upload(
    sender: str = "1", t: int = 3, run: str = "run", kind: str = "upload", **body: object
) -> bytes:
    payload: dict[str, object] = {
        "classes": np.array([0, 1]),
        "prototypes": np.ones((2, 8), np.float32),
    }
    payload.update(body)
    return encode(Message(kind, run, t, sender, payload))


def test_a_valid_upload_is_accepted_once() -> None:
    gate = _gate()
    upload = gate.check(3, "1", _upload(), INFO["1"])
    assert upload.client_id == "1"
    with pytest.raises(RejectedUpload) as info:
        gate.check(3, "1", _upload(), INFO["1"])
    assert info.value.reason == "duplicate"
    assert gate.rejections == {"duplicate": 1}


@pytest.mark.parametrize(
    ("t", "client", "raw", "reason"),
    [
        (2, "1", _upload(t=2), "stale"),
        (4, "1", _upload(t=4), "future"),
        (3, "1", _upload(t=2), "round_mismatch"),
        (3, "1", _upload(sender="2"), "sender"),
        (3, "1", _upload(run="other"), "run"),
        (3, "1", _upload(kind="metrics"), "type"),
        (3, "3", _upload(sender="3"), "not_selected"),
        (3, "1", _upload(weights=np.ones(10, np.float32)), "unknown_field"),
        (3, "1", _upload(raw_samples=np.ones((4, 16, 16), np.float32)), "unknown_field"),
        (3, "1", _upload(prototypes=np.full((2, 8), np.nan, np.float32)), "non_finite"),
        (3, "1", _upload(prototypes=np.ones((2, 8), np.float64)), "dtype"),
        (3, "1", _upload(prototypes=np.ones((2, 9), np.float32)), "shape"),
        (3, "1", _upload(counts=np.array([20, 20])), "unknown_field"),  # FedAPA never reads them
        (3, "1", _upload(classes=np.array([0, 99])), "range"),
        (3, "1", b"\x93\x01", "malformed"),
        (3, "1", b"\0" * 100_001, "oversize"),
    ],
)
def test_rejections(t: int, client: str, raw: bytes, reason: str) -> None:
    gate = _gate()
    with pytest.raises(RejectedUpload) as info:
        gate.check(t, client, raw, INFO[client])
    assert info.value.reason == reason
    assert gate.rejections[reason] == 1
    assert gate.accepted == {}


def test_unknown_client_is_rejected() -> None:
    with pytest.raises(RejectedUpload) as info:
        _gate().check(3, "1", _upload(), None)
    assert info.value.reason == "unknown_client"


def test_closed_round_rejects_late_uploads_as_stale() -> None:
    gate = _gate()
    gate.check(3, "1", _upload(), INFO["1"])
    assert [u.client_id for u in gate.close_round()] == ["1"]
    with pytest.raises(RejectedUpload) as info:
        gate.check(3, "2", _upload(sender="2"), INFO["2"])
    assert info.value.reason == "stale"


def test_a_retried_round_keeps_earlier_uploads() -> None:
    gate = _gate()
    gate.check(3, "1", _upload(), INFO["1"])
    gate.open_round(3, ["2"], keep=True)
    assert set(gate.accepted) == {"1"}
    gate.check(3, "2", _upload(sender="2"), INFO["2"])
    assert len(gate.close_round()) == 2
