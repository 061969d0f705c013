"""Control messages (status, start, state, metrics) built and read in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mqttfl.algorithms.base import Downlinks
from mqttfl.errors import WireError
from mqttfl.wire import Message, check_id, decode, encode
from mqttfl.wire.schemas import ClientInfo, require_keys

CONTROL_LIMIT = 1_000_000  # control messages are small; anything bigger is hostile
MAX_SAMPLE_DIMS, MAX_SAMPLE_SIDE = 4, 65_536  # bounds of an announced sample shape
COORDINATOR = "coordinator"


def status_online(run: str, info: ClientInfo) -> bytes:
    body = {
        "state": "online",
        "arch": info.arch,
        "classes": list(info.classes),
        "num_samples": info.num_samples,
        "sample_shape": list(info.sample_shape),
    }
    return encode(Message("status", run, 0, info.client_id, body))


def status_offline(run: str, client_id: str, reason: str) -> bytes:
    return encode(Message("status", run, 0, client_id, {"state": "offline", "reason": reason}))


def read_status(raw: bytes, topic_client: str) -> tuple[str, ClientInfo | None, str]:
    """Return (state, info if online, reason if offline); validates sender vs topic."""
    message = decode(raw, max_bytes=CONTROL_LIMIT)
    if message.type != "status":
        raise WireError("type", f"expected a status message, got {message.type}")
    if message.sender != topic_client:
        raise WireError("sender", f"status from {message.sender!r} on {topic_client!r}'s topic")
    check_id(message.sender)
    body = message.body
    require_keys(body, {"state": str})
    if body["state"] == "offline":
        return "offline", None, str(body.get("reason", ""))
    if body["state"] != "online":
        raise WireError("range", f"unknown status {body['state']!r}")
    require_keys(body, {"arch": str, "classes": list, "num_samples": int, "sample_shape": list})
    if not all(isinstance(c, int) for c in body["classes"] + body["sample_shape"]):
        raise WireError("type", "classes and sample_shape must be integers")
    # The coordinator builds the announced model to size its uploads: a sample shape of
    # 10^9 features would make that a memory bomb.
    shape = body["sample_shape"]
    if not 1 <= len(shape) <= MAX_SAMPLE_DIMS or not all(1 <= n <= MAX_SAMPLE_SIDE for n in shape):
        raise WireError(
            "range",
            f"sample_shape {shape[:8]} needs 1-{MAX_SAMPLE_DIMS} sides of 1-{MAX_SAMPLE_SIDE}",
        )
    if not 0 <= body["num_samples"] <= 2**40 or not all(0 <= c < 2**16 for c in body["classes"]):
        raise WireError("range", "num_samples or classes out of range")
    info = ClientInfo(
        client_id=message.sender,
        arch=body["arch"],
        classes=tuple(body["classes"]),
        num_samples=body["num_samples"],
        sample_shape=tuple(body["sample_shape"]),
    )
    return "online", info, ""


def round_state(
    run: str,
    *,
    status: str,
    round: int,
    selected: list[str] | None = None,
    deadline: float | None = None,
    params: dict[str, Any] | None = None,
    attempt: int = 1,
) -> bytes:
    """The retained run state; while a round is open it repeats the start message."""
    body: dict[str, Any] = {"status": status, "attempt": attempt}
    if selected is not None:
        body.update(selected=selected, deadline=deadline, params=params or {})
    return encode(Message("state", run, round, COORDINATOR, body))


def round_start(
    run: str,
    t: int,
    *,
    selected: list[str],
    deadline: float,
    params: dict[str, Any],
    attempt: int,
    uploaded: list[str] | None = None,
) -> bytes:
    """``uploaded`` lists the clients whose upload for round t the coordinator holds; a
    selected client that already trained t but is not listed sends its upload again (its
    first copy went to a coordinator that crashed, or was lost while the broker restarted)."""
    body = {
        "selected": selected,
        "deadline": deadline,
        "params": params,
        "attempt": attempt,
        "uploaded": uploaded or [],
    }
    return encode(Message("start", run, t, COORDINATOR, body))


def read_control(raw: bytes, kind: str) -> Message:
    message = decode(raw, max_bytes=None)
    if message.type != kind:
        raise WireError("type", f"expected {kind}, got {message.type}")
    if kind in ("start",) or (kind == "state" and "selected" in message.body):
        require_keys(message.body, {"selected": list, "deadline": float | int, "params": dict})
    if not isinstance(message.body.get("uploaded", []), list):
        raise WireError("type", "control field 'uploaded' must be a list")
    if kind == "state":
        require_keys(message.body, {"status": str})
    return message


METRIC_KEYS = {"accuracy": float, "f1": float, "mae": float}


def read_metrics(raw: bytes, topic_client: str) -> Message:
    message = decode(raw, max_bytes=CONTROL_LIMIT)
    if message.type != "metrics":
        raise WireError("type", f"expected metrics, got {message.type}")
    if message.sender != topic_client:
        raise WireError("sender", f"metrics from {message.sender!r} on {topic_client!r}'s topic")
    require_keys(message.body, {k: (float, int) for k in METRIC_KEYS})
    return message


@dataclass
class DownlinkPayloads:
    """One round's downlinks, encoded once: published, checkpointed and re-published as is."""

    broadcast: bytes
    personal: dict[str, bytes]


def encode_downlinks(run: str, t: int, downlinks: Downlinks) -> DownlinkPayloads:
    personal = {
        client: encode(Message("downlink", run, t, COORDINATOR, body))
        for client, body in downlinks.personal.items()
    }
    broadcast = encode(
        Message(
            "downlink",
            run,
            t,
            COORDINATOR,
            {**downlinks.broadcast, "_personal": sorted(downlinks.personal)},
        )
    )
    return DownlinkPayloads(broadcast, personal)
