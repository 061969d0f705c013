"""A client's privacy budget: it stops before the upload that would exceed it.

With ``[privacy] epsilon`` set, every upload costs the ε of one Gaussian mechanism
(:mod:`mqttfl.privacy.accountant`). Before it trains for a round, the client charges the
upload to its budget (:attr:`~mqttfl.nodes.client_state.Progress.uploads`, kept in its
state file across restarts); if the charge would take it past ε it does not train or
upload, logs ``privacy.budget_exhausted`` once, says ``offline`` on its status topic (so
the coordinator treats it as a client that left: not waited for, never selected again)
and ends its run.

With ``[privacy]`` on, the client's ``online`` announcement names no classes and no
sample count (:func:`announced`): those are the room's label set and its number of
windows, which no mechanism protects; nothing on the coordinator reads them.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import numpy as np

from mqttfl.files import read_bytes, write_atomic
from mqttfl.privacy.accountant import BUDGET_EXHAUSTED
from mqttfl.wire.control import Offline

if TYPE_CHECKING:
    import torch

    from mqttfl.algorithms.base import ClientSide, Context
    from mqttfl.bus.transport import Bus
    from mqttfl.config import RunConfig
    from mqttfl.nodes.client_state import Progress, StateFile
    from mqttfl.wire import PayloadSchema, Topics
    from mqttfl.wire.schemas import ClientInfo


class ClientRunner(Protocol):
    """What of :class:`mqttfl.nodes.client.ClientRunner` the budget check uses."""

    ctx: Context
    config: RunConfig
    client_id: str
    progress: Progress
    bus: Bus
    topics: Topics
    finished: asyncio.Event
    log: Any

    @property
    def state_file(self) -> StateFile: ...
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def method(self) -> ClientSide: ...


EXHAUSTED = BUDGET_EXHAUSTED  # the reason the client's ``offline`` status gives


async def privacy_allows(runner: ClientRunner, t: int) -> bool:
    """Charge round ``t``'s upload to the client's budget; False (and the client leaves)
    when it would exceed it. Always True with ``[privacy]`` off or without a budget."""
    privacy = runner.ctx.privacy
    if privacy is None:
        return True
    uploads = runner.progress.uploads
    if not privacy.would_exceed(uploads):
        runner.progress.uploads = uploads + 1
        return True
    if not runner.finished.is_set():
        runner.log.warning(
            "privacy.budget_exhausted",
            round=t,
            uploads=uploads,
            epsilon_spent=round(privacy.spent(uploads), 4),
            epsilon=privacy.epsilon,
            next_epsilon=round(privacy.spent(uploads + 1), 4),
        )
        offline = Offline(runner.client_id, EXHAUSTED).encode(runner.config.run_id)
        await runner.bus.publish(
            runner.topics.status(runner.client_id), offline, retain=True, timeout=5
        )
        runner.finished.set()
    return False


def announced(info: ClientInfo, ctx: Context) -> ClientInfo:
    """What the client's ``online`` status says of it: with [privacy] on, neither its
    classes nor its sample count."""
    if ctx.privacy is None:
        return info
    return replace(info, classes=(), num_samples=0)


def release_path(runner: ClientRunner) -> Path:
    """Where the newest noised upload waits, beside the client's state file."""
    return runner.state_file.path.with_suffix(".release")


async def keep_release(runner: ClientRunner, t: int, payload: bytes) -> None:
    """With [privacy], before round t's upload leaves the device: keep it on disk, and the
    state that records it trained and charged. A restarted client then sends these bytes
    again rather than noise drawn anew (two draws for one round are two releases), and
    never retrains a round it released (:func:`kept_release`)."""
    if runner.ctx.privacy is None:
        return
    kept = {"round": t, "instance": runner.progress.instance, "payload": payload}
    await asyncio.to_thread(write_atomic, release_path(runner), msgpack.packb(kept))
    await runner.state_file.save(runner.model, runner.method, runner.progress)
    await runner.state_file.written()


def kept_release(runner: ClientRunner, t: int) -> bytes | None:
    """Round t's released upload as it left the device, or None (with one line) when it is
    not on disk: a new one would release round t twice."""
    try:
        kept = msgpack.unpackb(read_bytes(release_path(runner)))
        same = kept["round"] == t and kept["instance"] == runner.progress.instance
        payload = kept["payload"] if same and isinstance(kept["payload"], bytes) else None
    except Exception:  # missing, cut short, not ours: nothing to send again
        payload = None
    if payload is None:
        runner.log.warning(
            "upload.not_resent", round=t, reason="its noised upload is not kept on this device"
        )
    return payload


def warn_if_noise_drowns(ctx: Context, uploads: PayloadSchema, labels: Any, log: Any) -> None:
    """With [privacy] on and a method that uploads class statistics: say once, with the
    figures, when no class of this device's shard reaches the count floor (a class is
    uploaded only when its noisy count reaches max(κ·√2·z, ½) windows), so that every
    upload would carry no class at all."""
    privacy = ctx.privacy
    if privacy is None or "prototypes" not in uploads.fields or len(labels) == 0:
        return
    floor = max(privacy.count_threshold * math.sqrt(2.0) * privacy.noise_multiplier, 0.5)
    largest = int(np.bincount(np.asarray(labels, dtype=np.int64)).max())
    if largest < floor:
        log.warning(
            "privacy.noise_drowns",
            largest_class_windows=largest,
            count_floor_windows=round(floor, 1),
            noise_multiplier=round(privacy.noise_multiplier, 4),
            reason="no class of this shard reaches the floor: uploads will carry no class",
        )
