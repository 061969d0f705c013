"""The client's round machine on its own clock: acknowledgements, the decision to train,
downlinks held until their round closed, the run instance, the privacy budget."""

from __future__ import annotations

import pytest

from mqttfl.nodes.client_machine import ClientRounds
from mqttfl.nodes.client_state import Progress
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire.control import RoundStart, RunStatus
from mqttfl.wire.downlinks import Downlink


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _start(t: int, *, selected: tuple[str, ...] = ("1", "2"), announcement: int = 1) -> RoundStart:
    return RoundStart(t, selected, 30.0, {}, announcement=announcement)


def _machine(**kwargs: object) -> tuple[ClientRounds, Clock]:
    clock = Clock()
    return ClientRounds("1", clock, **kwargs), clock  # type: ignore[arg-type]


def test_a_start_is_acknowledged_once_per_announcement_and_only_when_it_selects_us() -> None:
    rounds, _ = _machine()
    assert rounds.acknowledge(_start(1, selected=("2",))) is None
    assert rounds.acknowledge(_start(1)) == ""
    assert rounds.acknowledge(_start(1)) is None  # the same announcement again
    assert rounds.acknowledge(_start(1, announcement=2)) == ""  # a retry of the round
    assert rounds.newest_start == 1


def test_a_start_it_will_not_act_on_is_declined_at_once_with_its_reason() -> None:
    rounds, _ = _machine(progress=Progress(trained_round=4))
    assert rounds.acknowledge(_start(3)) == "trained_later"
    assert rounds.acknowledge(_start(4)) == ""  # it holds round 4's upload: sends it again
    rounds.refused_round = 5
    assert rounds.acknowledge(_start(5)) == "refused"


def test_training_waits_for_nothing_it_already_did_and_not_past_the_deadline() -> None:
    rounds, clock = _machine(progress=Progress(trained_round=2))
    assert rounds.train_verdict(_start(2), received=clock()) == "skip"
    start = _start(3)
    assert rounds.train_verdict(start, received=clock()) == "train"
    rounds.training_round = 3
    assert rounds.train_verdict(start, received=clock()) == "skip"  # being trained now
    rounds.training_round = 0
    received = clock()
    clock.now += 30.5  # the start waited in the queue past its 30 s
    assert rounds.train_verdict(start, received=received) == "deadline_passed"


def test_buffered_mode_trains_only_the_newest_version_it_holds() -> None:
    rounds, clock = _machine(buffered=True)
    rounds.acknowledge(_start(3))
    rounds.acknowledge(_start(5))
    assert rounds.train_verdict(_start(3), received=clock()) == "skip"
    assert rounds.train_verdict(_start(5), received=clock()) == "train"
    synchronous, clock = _machine()
    synchronous.acknowledge(_start(5))
    assert synchronous.train_verdict(_start(3), received=clock()) == "train"


def _down(t: int, *, personal_for: tuple[str, ...] | None = ("1",)) -> Downlink:
    return Downlink(t, {"x": t}, personal_for)


def test_a_downlink_is_applied_only_once_its_round_is_known_closed() -> None:
    rounds, _ = _machine()
    rounds.take_downlink(_down(2, personal_for=()), broadcast=True, size=10)  # sent early
    assert rounds.next_to_apply() is None
    rounds.on_progress(_start(2))  # round 2 open: round 1 closed, not 2
    assert rounds.next_to_apply() is None
    assert not rounds.on_progress(RunStatus("closed", 2))
    ready = rounds.next_to_apply()
    assert ready is not None
    assert ready.round == 2
    assert not ready.personal_missing
    assert ready.pending.size == 10
    assert rounds.applied(2) == 0
    rounds.take_downlink(_down(2, personal_for=()), broadcast=True, size=10)  # a replay
    assert rounds.next_to_apply() is None


def test_a_broadcast_naming_us_waits_for_its_personal_half_until_a_newer_round_comes() -> None:
    rounds, _ = _machine()
    rounds.on_progress(RunStatus("closed", 3))
    rounds.take_downlink(_down(2), broadcast=True, size=5)
    assert rounds.next_to_apply() is None  # waiting for client 1's personal downlink
    rounds.take_downlink(_down(2, personal_for=None), broadcast=False, size=7)
    ready = rounds.next_to_apply()
    assert ready is not None
    assert ready.pending.size == 12
    assert not ready.personal_missing
    rounds.applied(2)
    rounds.take_downlink(_down(3), broadcast=True, size=5)
    assert rounds.next_to_apply() is None
    rounds.take_downlink(_down(4, personal_for=()), broadcast=True, size=5)
    rounds.on_progress(RunStatus("closed", 4))
    ready = rounds.next_to_apply()  # round 4 came: round 3 goes without its personal half
    assert ready is not None
    assert ready.round == 3
    assert ready.personal_missing


def test_the_finished_run_applies_its_last_round_and_then_the_client_is_done() -> None:
    rounds, _ = _machine()
    rounds.take_downlink(_down(5, personal_for=()), broadcast=True, size=1)
    assert not rounds.done
    assert rounds.on_progress(RunStatus("finished", 5))
    ready = rounds.next_to_apply()
    assert ready is not None
    assert ready.round == 5
    assert not rounds.done
    rounds.applied(5)
    assert rounds.done


def test_a_state_of_another_instance_is_set_aside_before_anything_more() -> None:
    rounds, _ = _machine(progress=Progress(trained_round=3, applied_round=3, instance="a"))
    assert rounds.see_instance("a") is True  # resumed
    assert rounds.see_instance("a") is None  # nothing new
    rounds.closed_round, rounds.refused_round = 3, 2
    rounds.take_downlink(_down(4, personal_for=()), broadcast=True, size=1)
    assert rounds.see_instance("b") is None
    assert rounds.next_instance == "b"
    assert rounds.seen() == Progress(instance="b")  # what a start is judged against
    assert rounds.acknowledge(_start(1)) == ""  # not "trained_later": it starts afresh
    rounds.progress.trained_round = rounds.progress.applied_round = 0  # the fresh state
    assert rounds.start_afresh() == "b"
    assert (rounds.joined, rounds.closed_round, rounds.refused_round) == ("b", 0, 0)
    assert rounds.pending == {}
    fresh, _ = _machine()
    assert fresh.see_instance("c") is False  # adopted: it held nothing


@pytest.mark.parametrize("epsilon", [2.0, 8.0])
def test_each_upload_is_charged_and_the_one_past_the_budget_is_not(epsilon: float) -> None:
    privacy = PrivacySettings(
        clip=1.0,
        noise_multiplier=1.0,
        delta=1e-5,
        epsilon=epsilon,
        count_threshold=1.0,
        planned_uploads=10,
        sampling_rate=1.0,
    )
    rounds, _ = _machine(privacy=privacy)
    charged = 0
    while rounds.charge():
        charged += 1
        assert charged < 10_000
    assert rounds.progress.uploads == charged
    assert privacy.would_exceed(charged)
    assert not privacy.would_exceed(charged - 1)
    assert rounds.acknowledge(_start(1)) == "budget_spent"
    unlimited, _ = _machine()
    assert unlimited.charge()
    assert unlimited.progress.uploads == 0


def test_an_apply_is_written_at_once_only_for_a_round_trained_or_the_last() -> None:
    rounds, _ = _machine()
    assert not rounds.keeps(1, last_round=5)  # sat out: written with the next state
    rounds.trained(2, 100)
    assert rounds.keeps(2, last_round=5)  # its own update came back
    assert not rounds.keeps(3, last_round=5)
    assert rounds.keeps(5, last_round=5)  # the last round: every client writes it
    rounds.on_progress(RunStatus("finished", 4))
    assert rounds.keeps(4, last_round=5)  # a run that finished early: its last round
    buffered, _ = _machine(buffered=True)
    assert buffered.keeps(1, last_round=5)  # buffered mode writes every version


def test_a_round_is_scored_every_round_or_where_the_client_trained_and_at_the_last() -> None:
    rounds, _ = _machine()
    rounds.progress.trained_round = 3
    assert rounds.scores(2, "every_round", 5)
    assert not rounds.scores(2, "when_trained", 5)  # sat it out
    assert rounds.scores(3, "when_trained", 5)  # trained it
    assert rounds.scores(5, "when_trained", 5)  # the run's last: every client scores it


def test_fetching_on_demand_asks_for_a_broadcast_only_where_the_client_uses_it() -> None:
    rounds, _ = _machine(on_demand=True, last_round=6)
    assert rounds.fetches(_start(1)) == [1]  # chosen in round 1: nothing before it
    assert rounds.fetches(_start(2, selected=("2",))) == []  # sits round 2 out
    rounds.applied(1)
    assert rounds.fetched() == [1]  # round 1's is applied: no longer fetched
    assert rounds.fetches(_start(4)) == [3, 4]  # chosen again: the round before it, and its own
    assert rounds.fetches(RunStatus("open", 4, _start(4))) == []  # asked for already
    assert rounds.fetches(RunStatus("closed", 4)) == []
    rounds.applied(4)
    assert rounds.fetched() == [3, 4]
    assert rounds.fetches(_start(6, selected=("2",))) == [
        6
    ]  # the last round: every client scores it
    assert rounds.fetches(RunStatus("finished", 6)) == []
    late, _ = _machine(on_demand=True, last_round=6)
    assert late.fetches(RunStatus("closed", 6)) == [6]  # joined after the last round's start
    early, _ = _machine(on_demand=True, last_round=6)
    assert early.fetches(RunStatus("finished", 3)) == [3]  # ended early: its last round is 3
    everything, _ = _machine(last_round=6)  # not on demand: subscribed to every broadcast
    assert everything.fetches(_start(4)) == []


def test_a_start_waits_for_the_fetched_broadcast_before_it_and_trains_after() -> None:
    rounds, clock = _machine(on_demand=True, last_round=6)
    assert not rounds.waits_for_broadcast(_start(1), clock())  # nothing comes before round 1
    start = _start(3)
    assert rounds.waits_for_broadcast(start, clock())
    assert rounds.release_start() is None  # round 2's broadcast is not applied yet
    rounds.on_progress(start)
    rounds.take_downlink(_down(2, personal_for=()), broadcast=True, size=1)
    ready = rounds.next_to_apply()
    assert ready is not None
    assert ready.round == 2
    rounds.applied(2)
    assert rounds.release_start() == (start, clock())
    assert rounds.release_start() is None
    assert not rounds.waits_for_broadcast(start, clock())  # applied: it trains at once
    assert not _machine()[0].waits_for_broadcast(_start(3), clock())  # not on demand
