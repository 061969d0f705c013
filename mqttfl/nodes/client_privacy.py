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
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from mqttfl.files import read_bytes, write_atomic
from mqttfl.privacy.accountant import BUDGET_EXHAUSTED
from mqttfl.wire.control import Offline

if TYPE_CHECKING:
    from mqttfl.algorithms.base import Context
    from mqttfl.privacy.accountant import PrivacySettings
    from mqttfl.wire import PayloadSchema
    from mqttfl.wire.schemas import ClientInfo


EXHAUSTED = BUDGET_EXHAUSTED  # the reason the client's ``offline`` status gives


def budget_exhausted(
    privacy: PrivacySettings, client_id: str, run_id: str, t: int, uploads: int, log: Any
) -> bytes:
    """Log ``privacy.budget_exhausted`` for round ``t``; the ``offline`` status that says
    why the client leaves the run."""
    log.warning(
        "privacy.budget_exhausted",
        round=t,
        uploads=uploads,
        epsilon_spent=round(privacy.spent(uploads), 4),
        epsilon=privacy.epsilon,
        next_epsilon=round(privacy.spent(uploads + 1), 4),
    )
    return Offline(client_id, EXHAUSTED).encode(run_id)


def announced(info: ClientInfo, ctx: Context) -> ClientInfo:
    """What the client's ``online`` status says of it: with [privacy] on, neither its
    classes nor its sample count."""
    if ctx.privacy is None:
        return info
    return replace(info, classes=(), num_samples=0)


class Releases:
    """With [privacy], the newest noised upload as it left the device, kept beside the
    state file (``client-<id>.release``). A restarted client sends these bytes again
    rather than noise drawn anew (two draws for one round are two releases), and never
    retrains a round it released."""

    def __init__(self, state_path: Path, log: Any) -> None:
        self.path = state_path.with_suffix(".release")
        self.log = log

    async def keep(self, t: int, instance: str, payload: bytes) -> None:
        """Keep round t's upload on disk (the caller then saves the state that records it
        trained and charged, before it sends)."""
        kept = {"round": t, "instance": instance, "payload": payload}
        await asyncio.to_thread(write_atomic, self.path, msgpack.packb(kept))

    def kept(self, t: int, instance: str) -> bytes | None:
        """Round t's released upload as it left the device, or None (with one line) when
        it is not on disk: a new one would release round t twice."""
        try:
            kept = msgpack.unpackb(read_bytes(self.path))
            same = kept["round"] == t and kept["instance"] == instance
            payload = kept["payload"] if same and isinstance(kept["payload"], bytes) else None
        except Exception:  # missing, cut short, not ours: nothing to send again
            payload = None
        if payload is None:
            self.log.warning(
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
