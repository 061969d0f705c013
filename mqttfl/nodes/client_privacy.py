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
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from mqttfl.wire.control import Offline

if TYPE_CHECKING:
    from mqttfl.algorithms.base import Context
    from mqttfl.bus.transport import Bus
    from mqttfl.config import RunConfig
    from mqttfl.nodes.client_state import Progress
    from mqttfl.wire import Topics
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


#: the reason the client's ``offline`` status gives
EXHAUSTED = "privacy budget exhausted"


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
