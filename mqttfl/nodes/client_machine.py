"""The client's side of a round as a pure machine: what it has seen of the run, and what it
will do about each start, status and downlink. No I/O and no clock of its own (``clock``
is injected), so it is tested like the coordinator's engine; :class:`~mqttfl.nodes.client.
ClientRunner` is the adapter between it and the bus, the method and the disk.

Events in: a start that selects the client (:meth:`ClientRounds.acknowledge`, then
:meth:`~ClientRounds.train_verdict`), news of the run's progress (:meth:`~ClientRounds.
on_progress`), the instance a message names (:meth:`~ClientRounds.see_instance`), a
downlink (:meth:`~ClientRounds.take_downlink`). Decisions out: the acknowledgement's
reason, whether to train, the next downlink to apply (:meth:`~ClientRounds.next_to_apply`),
whether the client's budget pays an upload (:meth:`~ClientRounds.charge`), and when the
client is done (:attr:`~ClientRounds.done`).

A downlink is applied only once its round is known closed (its closed status, or a start
of the next one), in the order the worker acts, so one sent early (forged, for a round
still open or not yet announced) never is; the run's last round is applied on its
finished status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from mqttfl.nodes.client_inbox import PendingDownlink
from mqttfl.nodes.client_rounds import decline_reason, instance_verdict
from mqttfl.nodes.client_state import Progress
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire.control import RoundStart, RunStatus
from mqttfl.wire.downlinks import Downlink

#: ``train``: train round t now; ``skip``: nothing to do (trained, training, refused, or
#: a newer version is held in buffered mode); ``deadline_passed``: too late, say so
TrainVerdict = Literal["train", "skip", "deadline_passed"]


@dataclass
class Ready:
    """A downlink to apply now; ``personal_missing``: its personal half never came."""

    round: int
    pending: PendingDownlink
    personal_missing: bool


@dataclass
class ClientRounds:
    client_id: str
    clock: Callable[[], float]
    progress: Progress = field(default_factory=Progress)
    buffered: bool = False  # federation.mode = "buffered": train on the newest version held
    privacy: PrivacySettings | None = None
    closed_round: int = 0  # the newest round known closed
    training_round: int = 0  # the round being trained now (0: none)
    newest_start: int = 0  # the newest start that selected us
    refused_round: int = 0  # its training failed, or its upload the schema: not retrained
    next_instance: str = ""  # the run's instance, when our state is of another one
    joined: str = ""  # the run instance we take part in, once the run named it
    finish_round: int = 0  # the last round of the finished run (0: not finished)
    pending: dict[int, PendingDownlink] = field(default_factory=dict)
    acked: set[tuple[int, int]] = field(default_factory=set)  # (round, announcement)
    # Broadcasts fetched only when used (Algorithm.fetched_on_demand); the run's last
    # round, which every client scores; the rounds being fetched; a start that chose us,
    # held until the broadcast before it is applied.
    on_demand: bool = False
    last_round: int = 0
    fetching: set[int] = field(default_factory=set)
    held_start: tuple[RoundStart, float] | None = None

    # --- the run instance ----------------------------------------------------------------
    def see_instance(self, instance: str) -> bool | None:
        """The run names its instance. A state of another one is to be set aside before
        anything more is acted on (:meth:`start_afresh`); None then, or when nothing
        changed. Else True (resumed: the state is of it) or False (adopted)."""
        if not instance or instance in (self.joined, self.next_instance):
            return None
        verdict = instance_verdict(self.progress, instance)
        if verdict == "start_afresh":
            self.next_instance = instance
            return None
        self.progress.instance = self.joined = instance
        return verdict == "same"

    def seen(self) -> Progress:
        """Our progress as the worker will see it: nothing yet once a new instance is due."""
        return Progress(instance=self.next_instance) if self.next_instance else self.progress

    def start_afresh(self) -> str:
        """Our progress was put back fresh (the state set aside): join the new instance,
        forgetting what we held of the old one; return the new instance."""
        instance, self.next_instance = self.next_instance, ""
        self.progress.bytes_up.clear()
        self.progress.instance = self.joined = instance
        self.pending.clear()
        self.closed_round = self.refused_round = 0
        return instance

    # --- starts --------------------------------------------------------------------------
    def acknowledge(self, start: RoundStart) -> str | None:
        """What to tell the coordinator about a start at once: None (it does not select
        us, or we answered this announcement), "" (we will act on it), or the reason we
        will not (``budget_spent``: we leave the run instead)."""
        key = (start.round, start.announcement)
        if self.client_id not in start.selected or key in self.acked:
            return None
        self.newest_start = max(self.newest_start, start.round)
        self.acked.add(key)
        refused = 0 if self.next_instance else self.refused_round
        return decline_reason(
            start, self.client_id, self.seen(), refused_round=refused, privacy=self.privacy
        )

    def train_verdict(self, start: RoundStart, received: float) -> TrainVerdict:
        t = start.round
        if t <= self.progress.trained_round or t in (self.training_round, self.refused_round):
            return "skip"
        if self.buffered and t < self.newest_start:
            return "skip"  # buffered: train on the newest version we hold (engine/buffered.py)
        if self.clock() > received + start.timeout_s:
            return "deadline_passed"
        return "train"

    def charge(self) -> bool:
        """Charge one upload to [privacy]'s budget: False when it would exceed it (the
        client then leaves the run). Always True without a budget."""
        if self.privacy is None:
            return True
        if self.privacy.would_exceed(self.progress.uploads):
            return False
        self.progress.uploads += 1
        return True

    def trained(self, t: int, payload_bytes: int) -> None:
        self.progress.trained_round = t
        self.progress.bytes_up[t] = payload_bytes

    # --- the run's progress --------------------------------------------------------------
    def on_progress(self, message: RoundStart | RunStatus) -> bool:
        """A start of round t says t-1 closed; a status says closed or finished. True when
        it says the run finished (after its round ``finish_round``)."""
        if isinstance(message, RoundStart) or message.start is not None:
            start = message if isinstance(message, RoundStart) else message.start
            assert start is not None
            self.closed_round = max(self.closed_round, start.round - 1)
        elif message.phase == "closed":
            self.closed_round = max(self.closed_round, message.round)
        elif message.phase == "finished":
            self.finish_round = message.round
            return True
        return False

    # --- broadcasts fetched on demand -------------------------------------------------
    def fetches(self, message: RoundStart | RunStatus) -> list[int]:
        """The rounds whose broadcast to fetch now (none unless ``on_demand``): for a start
        that chooses us, the round before it (the broker's retained copy, unless applied)
        and its own; for the run's last round, its own; for a finished run, its last."""
        if not self.on_demand:
            return []
        start = message if isinstance(message, RoundStart) else message.start
        wanted: list[int] = []
        if start is not None:
            t, chosen = start.round, self.client_id in start.selected
            wanted = [t - 1, t] if chosen else [t] if t >= self.last_round else []
        elif isinstance(message, RunStatus) and (
            message.phase == "finished"
            or (message.phase == "closed" and message.round >= self.last_round)
        ):
            wanted = [message.round]
        new = [u for u in wanted if u > self.progress.applied_round and u not in self.fetching]
        self.fetching.update(new)
        return new

    def fetched(self) -> list[int]:
        """The rounds fetched whose broadcast is applied now: no longer to fetch."""
        done = sorted(u for u in self.fetching if u <= self.progress.applied_round)
        self.fetching.difference_update(done)
        return done

    def waits_for_broadcast(self, start: RoundStart, received: float) -> bool:
        """Whether a start that chose us waits for the broadcast of the round before it
        (fetched on demand, not yet applied); it is held until :meth:`release_start`."""
        if not self.on_demand or self.progress.applied_round >= start.round - 1:
            return False
        self.held_start = (start, received)
        return True

    def release_start(self) -> tuple[RoundStart, float] | None:
        """The held start, once the broadcast it waited for is applied."""
        held = self.held_start
        if held is None or self.progress.applied_round < held[0].round - 1:
            return None
        self.held_start = None
        return held

    # --- downlinks -----------------------------------------------------------------------
    def take_downlink(self, downlink: Downlink, *, broadcast: bool, size: int) -> None:
        t = downlink.round
        if t <= self.progress.applied_round:
            return
        pending = self.pending.setdefault(t, PendingDownlink())
        pending.size += size
        if broadcast:
            pending.broadcast = downlink
        else:
            pending.personal = downlink

    def next_to_apply(self) -> Ready | None:
        """The oldest downlink that can be applied now, taken out of ``pending``; None
        while it waits (its round not known closed, or its personal half on its way)."""
        for t in sorted(self.pending):
            pending = self.pending[t]
            last = t == self.finish_round
            if pending.broadcast is None or (t > self.closed_round and not last):
                continue  # held until its round is known closed
            wants_personal = self.client_id in (pending.broadcast.personal_for or ())
            newer = any(u > t and p.broadcast is not None for u, p in self.pending.items())
            if wants_personal and pending.personal is None and not (newer or last):
                return None  # wait for the personalized downlink
            del self.pending[t]
            return Ready(t, pending, wants_personal and pending.personal is None)
        return None

    def applied(self, t: int) -> int:
        """Round t's downlinks are applied; the bytes we uploaded in it (for its metrics)."""
        self.progress.applied_round = t
        return self.progress.bytes_up.pop(t, 0)

    def keeps(self, t: int, last_round: int) -> bool:
        """Whether the state with round t applied is written now: where this client trained
        round t (its own update came back), and at the run's last round. A round it sat
        out goes to disk with the next state it writes; killed before that, it resumes
        from the one it wrote last and takes the run's newest downlink, as a client that
        was away for those rounds does. An idle client then writes nothing a round. (In
        buffered mode every version applied is written.)"""
        return (
            self.buffered
            or t in (self.progress.trained_round, self.finish_round)
            or t >= last_round
        )

    def scores(self, t: int, evaluate: str, last_round: int) -> bool:
        """Whether round t's downlink is scored and reported (``federation.evaluate``):
        every round, or the rounds this client trained and the run's last."""
        return evaluate == "every_round" or t == self.progress.trained_round or t >= last_round

    @property
    def done(self) -> bool:
        """The run finished and its last round is applied."""
        return bool(self.finish_round) and self.progress.applied_round >= self.finish_round
