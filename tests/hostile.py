"""The catalogue of hostile uploads, each with the reason the coordinator must give.

One :class:`Scene` describes where the shots land (the run, the open round, a selected
victim, a registered but unselected client, a client that never announced itself); a
:class:`Hostile` builds its shot from the scene. The same catalogue is replayed against
an in-process :class:`~mqttfl.engine.gate.UploadGate` and against a live coordinator
over a real broker (tests/test_hostile_live.py).

``phase`` orders a live replay: ``before`` shots land while the victim has not uploaded
yet (so they reach the check they aim at), ``after`` shots follow the victim's one valid
upload (duplicates), ``closed`` shots follow the close of the round (replays, stale).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import numpy as np

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context
from mqttfl.algorithms.fedapa import FedAPAParams
from mqttfl.engine.gate import UploadGate
from mqttfl.wire import Message, encode
from mqttfl.wire.codec import ARRAY_EXT
from mqttfl.wire.schemas import ClientInfo


@dataclass(frozen=True)
class Scene:
    run_id: str
    round: int  # the open round
    victim: str  # registered and selected; its valid upload comes after the 'before' shots
    unselected: str  # registered, not selected in this round
    ghost: str  # never announced itself
    num_classes: int
    embed_dim: int
    max_upload_bytes: int
    classes: tuple[int, ...] = (0, 1, 2)

    def body(self, **changes: object) -> dict[str, object]:
        k = len(self.classes)
        rng = np.random.default_rng(k)
        body: dict[str, object] = {
            "classes": np.array(self.classes, np.int64),
            "prototypes": rng.standard_normal((k, self.embed_dim)).astype(np.float32),
        }
        body.update(changes)
        return {key: value for key, value in body.items() if value is not _DROP}

    def upload(
        self,
        *,
        sender: str | None = None,
        t: int | None = None,
        run: str | None = None,
        kind: str = "upload",
        **changes: object,
    ) -> bytes:
        t = self.round if t is None else t
        return encode(
            Message(kind, run or self.run_id, t, sender or self.victim, self.body(**changes))
        )

    def valid(self) -> bytes:
        return self.upload()


@dataclass(frozen=True)
class Shot:
    round: int  # the round in the topic
    client: str  # the client in the topic
    payload: bytes


@dataclass(frozen=True)
class Hostile:
    name: str
    reason: str
    build: Callable[[Scene], Shot]
    phase: str = "before"  # before | after | closed

    def shot(self, scene: Scene) -> Shot:
        return self.build(scene)


_DROP = object()


def _envelope(scene: Scene, **changes: object) -> bytes:
    envelope = {
        "v": 1,
        "type": "upload",
        "run": scene.run_id,
        "round": scene.round,
        "sender": scene.victim,
        "body": {},
    }
    envelope.update(changes)
    raw: bytes = msgpack.packb(envelope, use_bin_type=True)
    return raw


def _array_ext(dtype: str, shape: list[int], data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, shape, data]))


def _at(scene: Scene, payload: bytes, *, t: int | None = None, client: str | None = None) -> Shot:
    return Shot(scene.round if t is None else t, client or scene.victim, payload)


CATALOGUE: tuple[Hostile, ...] = (
    # --- bytes that are not a message ---------------------------------------------------
    Hostile("garbage bytes", "malformed", lambda s: _at(s, b"\xc1\xff\x00 not msgpack")),
    Hostile("truncated msgpack", "malformed", lambda s: _at(s, s.valid()[: len(s.valid()) // 2])),
    Hostile("a list, not a map", "malformed", lambda s: _at(s, msgpack.packb([1, 2, 3]))),
    Hostile("empty payload", "malformed", lambda s: _at(s, b"")),
    Hostile(
        "unknown msgpack extension",
        "malformed",
        lambda s: _at(s, _envelope(s, body={"x": msgpack.ExtType(42, b"\0" * 8)})),
    ),
    Hostile(
        "memory bomb: 10^18 floats declared, 16 bytes sent",
        "size",
        lambda s: _at(
            s, _envelope(s, body={"prototypes": _array_ext("<f4", [10**12, 10**6], b"\0" * 16)})
        ),
    ),
    Hostile(
        "array shorter than declared",
        "size",
        lambda s: _at(
            s, _envelope(s, body={"prototypes": _array_ext("<f4", [3, s.embed_dim], b"\0" * 12)})
        ),
    ),
    Hostile(
        "object dtype (pickle smuggling)",
        "dtype",
        lambda s: _at(s, _envelope(s, body={"prototypes": _array_ext("|O", [1], b"\0" * 8)})),
    ),
    Hostile(
        "negative array dimension",
        "shape",
        lambda s: _at(s, _envelope(s, body={"prototypes": _array_ext("<f4", [-1], b"")})),
    ),
    Hostile("oversize upload", "oversize", lambda s: _at(s, b"\0" * (s.max_upload_bytes + 1))),
    # --- envelopes -------------------------------------------------------------------------
    Hostile("unknown message type", "type", lambda s: _at(s, _envelope(s, type="pwn"))),
    Hostile("schema version from the future", "version", lambda s: _at(s, _envelope(s, v=2))),
    Hostile("extra envelope key", "envelope", lambda s: _at(s, _envelope(s, extra=1))),
    Hostile("negative round in the envelope", "envelope", lambda s: _at(s, _envelope(s, round=-1))),
    Hostile(
        "a metrics message on an upload topic", "type", lambda s: _at(s, s.upload(kind="metrics"))
    ),
    Hostile("another run's upload", "run", lambda s: _at(s, s.upload(run="other-run"))),
    Hostile(
        "envelope round differs from the topic's",
        "round_mismatch",
        lambda s: _at(s, s.upload(t=s.round + 7)),
    ),
    Hostile(
        "sender differs from the topic's client",
        "sender",
        lambda s: _at(s, s.upload(sender=s.unselected)),
    ),
    Hostile(
        "a client that never announced itself",
        "unknown_client",
        lambda s: _at(s, s.upload(sender=s.ghost), client=s.ghost),
    ),
    Hostile(
        "a client not selected this round",
        "not_selected",
        lambda s: _at(s, s.upload(sender=s.unselected), client=s.unselected),
    ),
    Hostile("stale round", "stale", lambda s: _at(s, s.upload(t=s.round - 1), t=s.round - 1)),
    Hostile("future round", "future", lambda s: _at(s, s.upload(t=s.round + 1), t=s.round + 1)),
    # --- bodies the method does not permit ----------------------------------------------------
    Hostile(
        "weights in a prototype upload",
        "unknown_field",
        lambda s: _at(s, s.upload(weights=np.ones(100, np.float32))),
    ),
    Hostile(
        "raw samples in the upload",
        "unknown_field",
        lambda s: _at(s, s.upload(raw_samples=np.ones((4, 24, 52), np.float32))),
    ),
    Hostile(
        "per-class counts (FedAPA's server never reads them)",
        "unknown_field",
        lambda s: _at(s, s.upload(counts=np.full(3, 7, np.int64))),
    ),
    Hostile(
        "a required field missing", "missing_field", lambda s: _at(s, s.upload(prototypes=_DROP))
    ),
    Hostile(
        "float64 prototypes",
        "dtype",
        lambda s: _at(s, s.upload(prototypes=np.ones((3, s.embed_dim), np.float64))),
    ),
    Hostile(
        "prototypes of the wrong width",
        "shape",
        lambda s: _at(s, s.upload(prototypes=np.ones((3, s.embed_dim + 1), np.float32))),
    ),
    Hostile(
        "prototypes for more classes than listed",
        "shape",
        lambda s: _at(s, s.upload(prototypes=np.ones((4, s.embed_dim), np.float32))),
    ),
    Hostile(
        "no classes at all",
        "shape",
        lambda s: _at(
            s,
            s.upload(
                classes=np.zeros(0, np.int64),
                prototypes=np.zeros((0, s.embed_dim), np.float32),
            ),
        ),
    ),
    Hostile(
        "NaN prototypes",
        "non_finite",
        lambda s: _at(s, s.upload(prototypes=np.full((3, s.embed_dim), np.nan, np.float32))),
    ),
    Hostile(
        "Inf prototypes",
        "non_finite",
        lambda s: _at(s, s.upload(prototypes=np.full((3, s.embed_dim), np.inf, np.float32))),
    ),
    Hostile("a negative class", "range", lambda s: _at(s, s.upload(classes=np.array([0, -1, 2])))),
    Hostile(
        "a class out of range",
        "range",
        lambda s: _at(s, s.upload(classes=np.array([0, 1, s.num_classes]))),
    ),
    Hostile(
        "a class listed twice", "range", lambda s: _at(s, s.upload(classes=np.array([0, 1, 1])))
    ),
    Hostile(
        "prototypes as a nested list",
        "type",
        lambda s: _at(s, s.upload(prototypes=[[0.0] * s.embed_dim] * 3)),
    ),
    Hostile("classes as a string", "type", lambda s: _at(s, s.upload(classes="many"))),
    # --- after the victim's one valid upload --------------------------------------------------
    Hostile(
        "duplicate of an accepted upload", "duplicate", lambda s: _at(s, s.valid()), phase="after"
    ),
    Hostile(
        "a second, different upload",
        "duplicate",
        lambda s: _at(s, s.upload(prototypes=np.zeros((3, s.embed_dim), np.float32))),
        phase="after",
    ),
    # --- after the round closed -----------------------------------------------------------------
    Hostile(
        "replay of an accepted upload after the close",
        "stale",
        lambda s: _at(s, s.valid()),
        phase="closed",
    ),
    Hostile(
        "replay onto the next round's topic",
        "round_mismatch",
        lambda s: _at(s, s.valid(), t=s.round + 1),
        phase="closed",
    ),
)


def expected_rejections(catalogue: tuple[Hostile, ...] = CATALOGUE) -> Counter[str]:
    return Counter(h.reason for h in catalogue)


def CONTROL_CATALOGUE(scene: Scene) -> list[tuple[str, bytes, str]]:
    """Hostile non-upload messages: (topic under mqttfl/<run>/, payload, reason). They are
    counted apart from upload rejections (summary.json's ``rejected_messages``)."""
    from mqttfl.wire.control import Online
    from mqttfl.wire.schemas import ClientInfo

    impostor = ClientInfo(scene.victim, "tiny", scene.classes, 96, (24, 242))
    metrics = {"accuracy": 1.0, "f1": 1.0, "mae": 0.0}
    return [
        ("status/h5", b"\xc1 not msgpack", "malformed"),
        ("status/h5", Online(impostor).encode(scene.run_id), "sender"),
        (
            "status/h5",
            encode(Message("status", scene.run_id, 0, "h5", {"state": "pwned"})),
            "range",
        ),
        (
            "status/h5",
            encode(Message("status", scene.run_id, 0, "h5", {"state": "online"})),
            "missing_field",
        ),
        ("round/1/metrics/0", b"\x00\x01", "malformed"),
        ("round/1/metrics/0", encode(Message("metrics", scene.run_id, 1, "1", metrics)), "sender"),
        ("round/x/up/0", scene.valid(), "topic"),
    ]


# --- the scene of the in-process tests (test_hostile_live.py, test_hostile_fuzz.py) -----------
CTX = Context(num_classes=21, embed_dim=8, rounds=5, seed=0, params=FedAPAParams())
SCENE = Scene(
    run_id="run",
    round=3,
    victim="v",
    unselected="u",
    ghost="g",
    num_classes=21,
    embed_dim=8,
    max_upload_bytes=100_000,
)
INFO = {c: ClientInfo(c, "tiny", (0, 1, 2), 40, (24, 52)) for c in ("v", "u", "x")}


def fresh_gate() -> UploadGate:
    """FedAPA's gate with SCENE's round open for the victim and one other client."""
    gate = UploadGate(get_algorithm("fedapa"), CTX, "run", max_bytes=SCENE.max_upload_bytes)
    gate.open_round(SCENE.round, ["v", "x"], keep=False)
    return gate
