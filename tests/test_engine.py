"""The round engine in-process, on a fake clock: retries, deadlines, wills, acknowledgements,
stale and duplicate uploads, a poisoned aggregate, the checkpoint and resume."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Algorithm, Downlinks, Upload
from mqttfl.algorithms.fedavg import FedAvgServer
from mqttfl.engine.actions import Announce, Close, Phase, Rebroadcast
from mqttfl.engine.rounds import RECONNECT_GRACE_S, WILL_SETTLE_S
from mqttfl.engine.state import RunState
from mqttfl.errors import RejectedUpload, RunAborted, WireError
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import Metrics
from mqttfl.wire.downlinks import read_downlink
from tests.bodies import array, editable, mapping
from tests.inprocess import RUN, Federation


def closed_at(fed: Federation, t: int) -> float:
    """The fake-clock time at which round t closed (after driving to it)."""
    fed.round(t)
    return fed.clock.now


def test_a_whole_run_closes_every_round_and_summarizes_every_client() -> None:
    fed = Federation("fedapa", clients=3, rounds=3).run()
    assert [c.round for c in fed.closed] == [1, 2, 3]
    assert fed.summary is not None
    assert fed.summary.rounds_completed == 3
    assert set(fed.summary.clients) == {"0", "1", "2"}
    assert fed.summary.missing_uploads == 0
    assert fed.summary.retries == 0
    # Every round closed on its uploads, not on a timer: the clock never moved.
    assert fed.clock.now == 1000.0


def test_a_selected_client_that_acknowledged_but_never_uploads_holds_the_round_to_its_deadline() -> (
    None
):
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny")
    fed.silent.add("2")
    opened = fed.clock.now
    assert closed_at(fed, 1) == pytest.approx(opened + fed.config.federation.round_timeout_s)
    assert fed.engine.state.missing_uploads == 1
    assert fed.closed[0].log["missing"] == ["2"]


def test_a_ghost_that_never_acknowledges_costs_one_ack_timeout_then_is_left_out() -> None:
    fed = Federation("fedavg", clients=3, rounds=4, arch="tiny", federation={"ack_timeout_s": 5.0})
    fed.ghosts.add("2")
    opened = fed.clock.now
    assert closed_at(fed, 1) == pytest.approx(opened + 5.0)  # not the 60 s deadline
    assert not fed.engine.clients["2"].responsive
    assert "2" not in fed.announced[1].start.selected  # round 2 left it out...
    fed.round(2)
    assert fed.clock.now == pytest.approx(opened + 5.0)  # ...and waited for nobody
    # It shows life again (a new announcement): it is selectable again.
    fed.ghosts.discard("2")
    fed.announce(fed.clients[2].info)
    fed.round(3)
    assert "2" in fed.announced[3].start.selected


def test_a_last_will_ends_the_wait_for_that_client_after_the_will_settles() -> None:
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny")
    fed.silent.add("1")
    fed.step()  # round 1 opens; 0 and 2 upload, 1 is training
    assert fed.engine.phase is Phase.OPEN
    t0 = fed.clock.now
    fed.leave("1")
    assert fed.engine.step() == []  # a will may be the broker going down: watch a moment
    fed.clock.advance(WILL_SETTLE_S)
    actions = fed.engine.step()
    assert fed.engine.state.round == 1
    assert fed.clock.now == pytest.approx(t0 + WILL_SETTLE_S)
    assert [type(a).__name__ for a in actions][:1] == ["Close"]


def test_after_a_broker_restart_the_round_waits_for_clients_to_come_back() -> None:
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny")
    fed.silent.add("2")
    fed.step()
    fed.leave("2")  # its will: the broker is going down
    fed.engine.on_broker_lost()
    fed.clock.advance(30.0)
    assert fed.engine.step() == []  # nothing closes while the broker is away
    fed.engine.on_broker_back()
    fed.clock.advance(RECONNECT_GRACE_S / 2)
    assert fed.engine.step() == []  # within the grace, the gone client may come back
    fed.silent.discard("2")
    fed.dead.discard("2")
    fed.announce(fed.clients[2].info)  # it reconnected
    client = fed.clients[2]
    client.train(1, {}, np.random.default_rng(0))
    fed.send_upload(1, "2", client.make_upload(1))
    fed.round(1)
    assert fed.closed[0].log["missing"] == []


def test_a_broker_that_came_back_gets_the_newest_broadcast_again_retained() -> None:
    """Clients fetch the retained broadcast when they join or are chosen; a broker that
    restarted may have lost it, so the coordinator publishes it again, once."""
    fed = Federation("fedavg", clients=2, rounds=3, arch="tiny")
    fed.round(1)
    assert not any(isinstance(a, Rebroadcast) for a in fed.engine.step())  # no loss, none
    fed.engine.on_broker_lost()
    fed.engine.on_broker_back()
    t, held = fed.engine.state.round, fed.engine.state.downlinks
    assert held is not None
    assert fed.engine.step()[:1] == [Rebroadcast(t, held.broadcast)]
    assert not any(isinstance(a, Rebroadcast) for a in fed.engine.step())  # once
    quiet = Federation("fedavg", clients=2, rounds=3, arch="tiny")
    quiet.engine.on_broker_lost()
    quiet.engine.on_broker_back()
    assert not any(isinstance(a, Rebroadcast) for a in quiet.engine.step())  # nothing closed yet


def test_too_few_uploads_retry_with_a_new_announcement_and_abort_after_the_last_attempt() -> None:
    fed = Federation(
        "fedavg",
        clients=2,
        rounds=2,
        arch="tiny",
        federation={"min_clients": 2, "max_round_attempts": 3, "round_timeout_s": 10.0},
    )
    fed.silent.add("1")
    with pytest.raises(RunAborted, match="after 3 attempts"):
        fed.run()
    starts = [a.start for a in fed.announced]
    assert [s.attempt for s in starts] == [1, 2, 3]
    assert len({s.announcement for s in starts}) == 3
    assert starts[1].uploaded == ("0",)  # the retry keeps the upload of the first attempt
    assert fed.engine.state.retries == 3


def test_stale_duplicate_and_future_uploads_are_rejected_and_counted() -> None:
    fed = Federation("fedavg", clients=2, rounds=3, arch="tiny")
    fed.round(1)  # and round 2 opened at once; both have uploaded to it
    body = fed.uploads[0].body
    rejected = []
    for t in (1, 2, 3):  # closed, open and already uploaded, not open yet
        with pytest.raises(RejectedUpload) as info:
            fed.send_upload(t, "0", body)
        rejected.append(info.value.reason)
    assert rejected == ["stale", "duplicate", "future"]
    assert fed.engine.state.rejections == {"stale": 1, "duplicate": 1, "future": 1}


class PoisonableServer(FedAvgServer):
    """FedAvg whose aggregate turns non-finite when an upload's weights exceed 100."""

    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        down = super().aggregate(t, uploads, staleness)
        if any(float(np.abs(array(u.body, "weights")).max()) > 100 for u in uploads):
            poisoned = {k: v * np.inf for k, v in mapping(down.broadcast, "weights").items()}
            down.broadcast = {**down.broadcast, "weights": poisoned}
        return down


def test_an_upload_that_poisons_the_aggregate_is_dropped_not_the_round() -> None:
    fedavg = get_algorithm("fedavg")
    poisonable = Algorithm("poisonable", PoisonableServer, fedavg.client)
    fed = Federation("fedavg", clients=3, rounds=1, arch="tiny", algorithm=poisonable)
    fed.step()  # round 1 open, all three uploaded
    fed.engine.gate.accepted.pop("2")
    client = fed.clients[2]
    body = editable(client.make_upload(1))
    body["weights"] = body["weights"] + 500.0  # within the schema's bound, fatal to the mean
    fed.send_upload(1, "2", body)
    fed.run()
    assert fed.engine.state.rejections["dropped_from_aggregate"] == 1
    broadcast = read_downlink(fed.closed[0].payloads.broadcast, run_id=RUN, round=1, client="all")
    weights = next(iter(broadcast.body["weights"].values()))
    assert np.isfinite(weights).all()
    assert np.abs(weights).max() < 100


def test_absurd_but_finite_prototypes_are_refused_by_the_schema() -> None:
    fed = Federation("fedapa", clients=2, rounds=2)
    fed.round(1)  # and round 2 opened at once; both have uploaded to it
    fed.engine.gate.accepted.pop("1")
    body = dict(fed.uploads[1].body)
    body["prototypes"] = np.full_like(body["prototypes"], 3e38)
    with pytest.raises(RejectedUpload) as info:
        fed.send_upload(2, "1", body)
    assert info.value.reason == "range"


def test_metrics_from_strangers_or_for_open_rounds_are_refused() -> None:
    fed = Federation("fedavg", clients=2, rounds=2, arch="tiny")
    fed.round(1)
    values = {"accuracy": 0.5, "f1": 0.5, "mae": 1.0}
    with pytest.raises(WireError) as stranger:
        fed.engine.on_metrics(Metrics(1, "99", values))
    with pytest.raises(WireError) as future:
        fed.engine.on_metrics(Metrics(2, "0", values))
    assert (stranger.value.reason, future.value.reason) == ("unknown_client", "future")
    assert {r.client_id for r in fed.engine.records} == {"0", "1"}


def test_run_state_survives_the_checkpoint_codec_and_resumes_the_next_round() -> None:
    fed = Federation("fedapa", clients=3, rounds=4)
    fed.round(2)
    saved = fed.closed[-1].checkpoint
    assert saved is not None
    state = RunState.from_dict(unpack_data(pack_data(saved)), fed.config, source="test")
    assert state.round == 2
    assert state.clients == ["0", "1", "2"]
    assert state.downlinks == fed.closed[-1].payloads
    assert pack_data(state.to_dict(fed.config)) == pack_data(saved)
    with pytest.raises(Exception, match="belongs to run"):
        RunState.from_dict({**saved, "method": "fedavg"}, fed.config, source="test")

    resumed = Federation("fedapa", clients=3, rounds=4, state=state)
    assert resumed.engine.phase is Phase.RESUMING
    actions = resumed.engine.step()  # every known client announced itself: re-publish, go on
    republished = [a for a in actions if not isinstance(a, Announce)]
    assert isinstance(republished[0], Close)
    assert republished[0].checkpoint is None
    assert republished[0].payloads == state.downlinks
    assert isinstance(actions[-1], Announce)
    assert actions[-1].start.round == 3
    server_state: dict[str, Any] = resumed.engine.server.state_dict()
    assert server_state.keys() == mapping(saved, "server").keys()


def test_the_engine_reads_only_its_injected_clock() -> None:
    """Deadlines are relative to the engine's clock: a clock far from the wall still works."""
    fed = Federation("fedavg", clients=2, rounds=1, arch="tiny")
    fed.clock.now = -1e9
    fed.silent.add("1")
    opened = fed.clock.now
    fed.run()
    assert fed.clock.now == pytest.approx(opened + fed.config.federation.round_timeout_s)
    assert fed.announced[0].start.timeout_s == fed.config.federation.round_timeout_s


def test_a_straggler_late_upload_is_stale_and_it_catches_up_the_next_round() -> None:
    """The logic of the process-level straggler drill, on the injected clock: a client that
    acknowledged a round but uploads only after its deadline is missing, then late (stale),
    and is accepted again the next round; however slow the machine."""
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny")
    fed.silent.add("2")  # acknowledges round 1, uploads nothing before the deadline
    opened = fed.clock.now
    assert closed_at(fed, 1) == pytest.approx(opened + fed.config.federation.round_timeout_s)
    assert fed.closed[0].log["missing"] == ["2"]
    fed.silent.discard("2")  # (round 2 is already open: it answers the next start)
    straggler = fed.clients[2]
    straggler.train(1, {}, np.random.default_rng(0))
    with pytest.raises(RejectedUpload) as late:
        fed.send_upload(1, "2", straggler.make_upload(1))
    assert late.value.reason == "stale"
    assert "after it closed" in late.value.detail
    fed.send_upload(2, "2", straggler.make_upload(2))  # round 2: on time, accepted
    fed.run()
    assert fed.closed[1].log["missing"] == []
    assert fed.summary is not None
    assert fed.summary.rejections == {"stale": 1}
    assert fed.summary.missing_uploads == 1


def test_a_paced_run_opens_a_round_no_sooner_than_pace_s_after_the_last() -> None:
    fed = Federation("fedavg", clients=2, rounds=3, arch="tiny", federation={"pace_s": 20.0})
    fed.run()
    starts = [a.start.round for a in fed.announced]
    assert starts == [1, 2, 3]
    # the clients answer at once: only the pace moves the clock, 20 s a round
    assert fed.clock.now == pytest.approx(1000.0 + 2 * 20.0)


def test_final_scores_that_never_come_are_named_once_the_wait_is_over() -> None:
    from structlog.testing import capture_logs

    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny", federation={"ack_timeout_s": 5.0})
    fed.ghosts.add("2")  # online to the end, answers nothing: no last scores either
    with capture_logs() as logs:
        closed = closed_at(fed, 2)
        fed.run()
    [missing] = [e for e in logs if e["event"] == "metrics.missing"]
    assert missing["missing"] == ["2"]
    assert missing["clients"] == 1
    assert missing["hint"] == "federation.final_metrics_timeout_s"
    [finished] = [e for e in logs if e["event"] == "run.finished"]
    assert finished["unreported"] == 1
    assert fed.clock.now == pytest.approx(closed + fed.config.federation.final_metrics_timeout_s)


def test_the_wait_for_final_scores_counts_from_the_newest_of_them() -> None:
    from structlog.testing import capture_logs

    from mqttfl.wire.control import read_metrics

    fed = Federation("fedavg", clients=4, rounds=2, arch="tiny", federation={"ack_timeout_s": 5.0})
    fed.ghosts |= {"2", "3"}  # both score nothing when the last round closes
    closed = closed_at(fed, 2)
    timeout = fed.config.federation.final_metrics_timeout_s
    fed.clock.now = closed + timeout - 5.0
    assert fed.engine.step() == []
    late = Metrics(2, "3", {"accuracy": 0.5, "f1": 0.5, "mae": 0.0}).encode(RUN)
    fed.engine.on_metrics(read_metrics(late, run_id=RUN, round=2, client="3"))
    with capture_logs() as logs:
        fed.run()
    # "3" scored 5 s before the wait would have ended: it goes on a whole timeout from there
    assert fed.clock.now == pytest.approx(closed + 2 * timeout - 5.0)
    [missing] = [e for e in logs if e["event"] == "metrics.missing"]
    assert missing["missing"] == ["2"]
    assert {r.client_id for r in fed.engine.records if r.round == 2} == {"0", "1", "3"}


def test_a_run_whose_clients_all_report_names_none_missing() -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        Federation("fedavg", clients=3, rounds=2, arch="tiny").run()
    assert not [e for e in logs if e["event"] == "metrics.missing"]
    [finished] = [e for e in logs if e["event"] == "run.finished"]
    assert finished["unreported"] == 0
