"""Aggregation that one bad upload cannot spoil: check the result, drop the offender."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from mqttfl.algorithms.base import Downlinks, ServerSide, Upload
from mqttfl.errors import RunAborted
from mqttfl.wire.schemas import Body


def is_finite(tree: Any) -> bool:
    """Every float in a downlink tree (maps of arrays and numbers) is finite."""
    if isinstance(tree, np.ndarray):
        return tree.dtype.kind != "f" or bool(np.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(is_finite(v) for v in tree.values())
    if isinstance(tree, float):
        return math.isfinite(tree)
    return True


def magnitude(body: Body) -> float:
    """The largest absolute value among an upload's arrays."""
    return max(
        (float(np.abs(v).max()) for v in body.values() if isinstance(v, np.ndarray) and v.size),
        default=0.0,
    )


def aggregate_checked(
    server: ServerSide,
    t: int,
    uploads: list[Upload],
    rejections: Counter[str],
    log: Any,
    *,
    staleness: Mapping[str, float] | None = None,
) -> Downlinks:
    """Aggregate; if the result is not finite (or the method fails on its inputs), drop the
    upload of largest magnitude, restore the server's state and aggregate again: one
    offender never costs the round. Each drop is counted and logged."""
    before = server.state_dict()
    remaining = list(uploads)
    while True:
        try:
            # synchronous rounds call it as a method written for them may declare it
            downlinks = (
                server.aggregate(t, remaining)
                if staleness is None
                else server.aggregate(t, remaining, staleness)
            )
            if is_finite(downlinks.broadcast) and is_finite(downlinks.personal):
                return downlinks
            reason = "non_finite_aggregate"
        except Exception as exc:  # a method error caused by an input: never the run's end
            reason = f"aggregation_failed: {type(exc).__name__}: {exc}"[:200]
        if len(remaining) <= 1:
            raise RunAborted(f"round {t}: no aggregate could be formed ({reason})")
        offender = max(remaining, key=lambda u: magnitude(u.body))
        remaining.remove(offender)
        server.load_state_dict(before)
        rejections["dropped_from_aggregate"] += 1
        log.warning("upload.dropped", round=t, client=offender.client_id, reason=reason)
