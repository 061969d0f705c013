"""A client's decisions about what the run announces, as pure functions of its progress.

- :func:`instance_verdict`: whether the run instance a start or run state names is the
  one the client's state belongs to. A run id can be started again from a clean slate
  (``coordinator --clear-run``, or a fresh broker and run directory); the coordinator
  then makes a new instance id, and a device that kept its state from the earlier
  instance must not resume it: it would take round 1 for a round it already trained.
- :func:`decline_reason`: whether the client will act on a round start that selects it.
  A client that will not (a round older than one it trained, a round whose update its
  own check refused) says so at once on its acknowledgement topic (``cannot_train``), so
  the round does not wait for it until its deadline (:mod:`mqttfl.engine.selection`);
  one whose privacy budget cannot pay the upload leaves the run at once, its ``offline``
  status saying why (:mod:`mqttfl.nodes.client_privacy`).
"""

from __future__ import annotations

from typing import Literal

from mqttfl.nodes.client_state import Progress
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire.control import RoundStart

Verdict = Literal["same", "adopt", "start_afresh"]


def instance_verdict(progress: Progress, instance: str) -> Verdict:
    """``same``: the state is of this instance (or the run names none); ``adopt``: the
    state holds nothing of any instance yet; ``start_afresh``: it holds rounds of another
    instance, or of one it never recorded."""
    if not instance or instance == progress.instance:
        return "same"
    if progress.trained_round == 0 and progress.applied_round == 0 and progress.uploads == 0:
        return "adopt"
    return "start_afresh"


def decline_reason(
    start: RoundStart,
    client_id: str,
    progress: Progress,
    *,
    refused_round: int,
    privacy: PrivacySettings | None,
) -> str:
    """Why the client will not act on ``start`` (a short reason code), or "" when it will
    train the round or send its upload again."""
    t = start.round
    if t < progress.trained_round:
        return "trained_later"  # its model has moved past round t: it cannot train it
    if t == progress.trained_round:
        return ""  # it holds round t's upload: sent again unless the coordinator has it
    if t == refused_round:
        return "refused"  # its own check refused round t's update, once for every attempt
    if privacy is not None and privacy.would_exceed(progress.uploads):
        return "budget_spent"
    return ""
