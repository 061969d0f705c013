"""A client's decisions about the run's announcements (mqttfl/nodes/client_rounds.py):
which run instance its state belongs to, and which round starts it will not act on, said
at once so that no round waits out its deadline for it. The decline feeds the real
engine on its fake clock here; tests/test_run_instance.py runs it with real processes."""

from __future__ import annotations

import pytest

from mqttfl.engine.actions import Close, Phase
from mqttfl.engine.documents import checkpoint_from_map
from mqttfl.engine.state import RunState
from mqttfl.errors import WireError
from mqttfl.nodes.client_rounds import decline_reason, instance_verdict
from mqttfl.nodes.client_state import Progress
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire.control import RoundStart, RunStatus, read_run_status, read_start
from tests.inprocess import RUN, Federation
from tests.test_refusals import cannot_train


def start(t: int, *, uploaded: tuple[str, ...] = (), instance: str = "") -> RoundStart:
    return RoundStart(t, ("0", "1"), 60.0, {}, uploaded=uploaded, instance=instance)


@pytest.mark.parametrize(
    ("progress", "instance", "verdict"),
    [
        (Progress(), "", "same"),  # the run names no instance: nothing to tell apart
        (Progress(instance="aa"), "aa", "same"),
        (Progress(), "bb", "adopt"),  # a fresh state takes the run's instance
        (Progress(trained_round=3, applied_round=3, instance="aa"), "bb", "start_afresh"),
        (Progress(applied_round=1, instance="aa"), "bb", "start_afresh"),
        (Progress(uploads=1, instance="aa"), "bb", "start_afresh"),  # a privacy charge
        (Progress(trained_round=2), "bb", "start_afresh"),  # rounds of no recorded instance
    ],
)
def test_which_instance_a_state_belongs_to(progress: Progress, instance: str, verdict: str) -> None:
    assert instance_verdict(progress, instance) == verdict


@pytest.mark.parametrize(
    ("t", "trained", "refused", "uploaded", "reason"),
    [
        (4, 3, 0, (), ""),  # the next round: it trains
        (2, 3, 0, (), "trained_later"),  # its model moved past round 2
        (1, 3, 0, ("0",), "trained_later"),
        (3, 3, 0, (), ""),  # it holds round 3's upload: sends it again
        (3, 3, 0, ("0",), ""),  # the coordinator holds it: nothing to wait for either way
        (4, 3, 4, (), "refused"),  # its own check refused round 4's update
    ],
)
def test_which_starts_a_client_declines(
    t: int, trained: int, refused: int, uploaded: tuple[str, ...], reason: str
) -> None:
    progress = Progress(trained_round=trained, applied_round=trained)
    got = decline_reason(
        start(t, uploaded=uploaded), "0", progress, refused_round=refused, privacy=None
    )
    assert got == reason


def test_a_client_whose_next_upload_exceeds_its_budget_declines() -> None:
    privacy = PrivacySettings(
        clip=1.0,
        noise_multiplier=3.0,
        delta=1e-5,
        epsilon=3.0,
        count_threshold=3.0,
        planned_uploads=10,
        sampling_rate=1.0,
    )
    spent = next(n for n in range(10_000) if privacy.would_exceed(n))
    assert spent > 1
    within = Progress(trained_round=2, uploads=spent - 1)
    over = Progress(trained_round=2, uploads=spent)
    assert decline_reason(start(3), "0", within, refused_round=0, privacy=privacy) == ""
    assert decline_reason(start(3), "0", over, refused_round=0, privacy=privacy) == "budget_spent"


def test_the_decline_closes_the_round_at_once_on_the_engines_clock() -> None:
    """A selected client that trained later rounds (the coordinator announces one it is
    past) declines at once; the round closes then, not at its 60 s deadline."""
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny")
    fed.silent.add("2")  # acknowledges, then is what the decline is about
    fed.step()
    assert fed.engine.phase is Phase.OPEN
    opened_at = fed.clock.now
    assert [a for a in fed.engine.step() if isinstance(a, Close)] == []  # it waits for 2
    announced = fed.announced[-1].start
    ahead = Progress(trained_round=5, applied_round=5)
    reason = decline_reason(announced, "2", ahead, refused_round=0, privacy=None)
    assert reason == "trained_later"
    cannot_train(fed, "2", reason=reason)
    [close] = [a for a in fed.engine.step() if isinstance(a, Close)]
    assert fed.clock.now == opened_at
    assert close.log["missing"] == ["2"]


def test_the_instance_travels_with_starts_and_run_states() -> None:
    status = RunStatus(
        "open", 2, start(2, instance="0123456789abcdef"), instance="0123456789abcdef"
    )
    back = read_run_status(status.encode(RUN), run_id=RUN)
    assert back.instance == "0123456789abcdef"
    assert back.start is not None
    assert back.start.instance == "0123456789abcdef"
    raw = start(2, instance="0123456789abcdef").encode(RUN)
    assert read_start(raw, run_id=RUN, round=2).instance == "0123456789abcdef"
    with pytest.raises(WireError, match="instance"):
        RunStatus("closed", 1, instance="not hex!")


def test_the_engine_names_its_instance_in_every_start_and_keeps_it_across_a_resume() -> None:
    fed = Federation("fedavg", clients=2, rounds=2, arch="tiny")
    fed.step()
    instance = fed.engine.state.instance
    assert len(instance) == 16
    announce = fed.announced[-1]
    assert announce.start.instance == instance
    assert announce.status.instance == instance
    data = fed.engine.state.to_dict(fed.config)
    resumed = RunState.from_checkpoint(checkpoint_from_map(data, "x", run_id=RUN, method="fedavg"))
    assert resumed.instance == instance
    assert RunState().instance != RunState().instance  # a fresh start is a new instance
    legacy = {k: v for k, v in data.items() if k != "instance"}
    older = RunState.from_checkpoint(checkpoint_from_map(legacy, "x", run_id=RUN, method="fedavg"))
    assert len(older.instance) == 16  # a checkpoint that names none gets one
