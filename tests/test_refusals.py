"""A refused upload, or a client that says it cannot train, ends the round's wait for it
at once: the round closes as soon as every selected client has
uploaded or been refused. On the engine's fake clock, no sleeping."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mqttfl.algorithms.common.weights import weights_length
from mqttfl.engine.actions import Close, Phase
from mqttfl.errors import RejectedUpload, RunAborted, WireError
from mqttfl.wire import Message, encode
from mqttfl.wire.control import Ack, read_ack
from tests.inprocess import RUN, Federation
from tests.test_buffered_engine import Driver, config


def opened(**federation: Any) -> Federation:
    """Round 1 open on three clients: 0 and 1 have uploaded, 2 acknowledged and trains."""
    fed = Federation("fedavg", clients=3, rounds=2, arch="tiny", federation=federation)
    fed.silent.add("2")
    fed.step()
    assert fed.engine.phase is Phase.OPEN
    assert sorted(fed.engine.gate.accepted) == ["0", "1"]
    return fed


def refuse(fed: Federation, client: str, t: int = 1) -> None:
    with pytest.raises(RejectedUpload):
        fed.send_upload(t, client, {"weights": np.zeros(3, np.float32)})


def cannot_train(fed: Federation, client: str, t: int = 1, reason: str = "range") -> None:
    announcement = fed.announced[-1].start.announcement
    raw = Ack(t, client, announcement, reason).encode(RUN)
    fed.engine.on_ack(read_ack(raw, run_id=RUN, round=t, client=client))


def valid_upload(fed: Federation, client: str, t: int = 1) -> None:
    side = fed.clients[int(client)]
    side.train(t, dict(fed.announced[-1].start.params), np.random.default_rng([t, 9]))
    fed.send_upload(t, client, side.make_upload(t))


def closes(fed: Federation) -> list[Close]:
    return [a for a in fed.engine.step() if isinstance(a, Close)]


def test_a_refused_upload_closes_the_round_at_once() -> None:
    fed = opened()
    before = fed.clock.now
    assert closes(fed) == []  # 2 acknowledged: the round waits for it
    refuse(fed, "2")
    assert fed.engine.refused.reasons == {"2": "missing_field"}
    [close] = closes(fed)
    assert fed.clock.now == before  # not the 60 s deadline
    assert close.round == 1
    assert close.log["missing"] == ["2"]
    assert fed.engine.state.missing_uploads == 1


def test_a_client_that_cannot_train_closes_the_round_at_once() -> None:
    fed = opened()
    before = fed.clock.now
    cannot_train(fed, "2")
    assert fed.engine.refused.reasons == {"2": "cannot_train: range"}
    [close] = closes(fed)
    assert fed.clock.now == before
    assert close.log["missing"] == ["2"]


def test_without_refusals_the_round_still_waits_for_its_deadline() -> None:
    fed = opened()
    opened_at = fed.clock.now
    fed.round(1)
    assert fed.clock.now == pytest.approx(opened_at + fed.config.federation.round_timeout_s)


def test_a_refused_client_cannot_close_the_round_for_others_by_spamming() -> None:
    fed = opened()
    fed.silent.add("1")  # round 2: 1 and 2 acknowledge and train, 0 uploads
    fed.round(1)
    opened_at = fed.clock.now
    fed.step()
    assert fed.engine.round == 2
    assert sorted(fed.engine.gate.accepted) == ["0"]
    for _ in range(50):
        refuse(fed, "2", t=2)
        cannot_train(fed, "2", t=2)
    assert fed.engine.refused.reasons == {"2": "missing_field"}  # one refusal counts, the first
    assert fed.engine.state.rejections["missing_field"] >= 50  # each copy is still counted
    assert closes(fed) == []  # 1 is still training: the round waits for it
    fed.round(2)
    assert fed.clock.now == pytest.approx(opened_at + fed.config.federation.round_timeout_s)
    assert fed.closed[-1].log["missing"] == ["1", "2"]


def test_refusals_of_another_round_or_of_an_unselected_client_do_not_count() -> None:
    fed = Federation(
        "fedavg", clients=3, rounds=2, arch="tiny", federation={"fraction": 0.5, "min_clients": 2}
    )
    fed.silent.update({"0", "1", "2"})
    fed.step()  # round 1 selects 2 of 3, who acknowledge and train
    [out] = [c for c in "012" if c not in fed.announced[-1].start.selected]
    refuse(fed, out)  # not_selected
    for client in fed.announced[-1].start.selected:
        refuse(fed, client, t=2)  # future
        cannot_train(fed, client, t=2)  # not the open round
    assert fed.engine.refused.reasons == {}
    assert closes(fed) == []


def test_a_refused_client_may_still_upload_a_valid_copy_while_the_round_is_open() -> None:
    fed = opened()
    fed.silent.add("1")
    fed.round(1)
    fed.step()  # round 2: 0 uploaded, 1 and 2 train
    refuse(fed, "2", t=2)
    valid_upload(fed, "2", t=2)  # taken: a refusal is not a ban
    assert sorted(fed.engine.gate.accepted) == ["0", "2"]
    refuse(fed, "1", t=2)
    [close] = closes(fed)
    assert close.log["uploads"] == 2
    assert close.log["missing"] == ["1"]
    with pytest.raises(RejectedUpload) as late:
        valid_upload(fed, "1", t=2)  # after the close, a copy is stale as before
    assert late.value.reason == "stale"


def test_a_round_everyone_refused_retries_without_waiting_and_then_aborts() -> None:
    fed = Federation(
        "fedavg", clients=2, rounds=1, arch="tiny", federation={"max_round_attempts": 2}
    )
    fed.silent.update({"0", "1"})
    fed.step()
    start = fed.clock.now
    cannot_train(fed, "0")
    refuse(fed, "1")
    with pytest.raises(RunAborted):
        fed.run(max_steps=20)
    # the retry's grace (3 s) at most, never a 60 s deadline
    assert fed.clock.now - start < fed.config.federation.round_timeout_s
    assert fed.engine.state.retries == 2


def test_buffered_mode_does_not_wait_for_a_refused_client() -> None:
    d = Driver(config("fedavg", num_clients=3, buffer_size=3))
    n = weights_length(d.ctx, d.infos[0])

    def body(client: int) -> dict[str, Any]:
        return {"weights": np.ones(n, np.float32), "num_samples": d.infos[client].num_samples}

    d.upload(1, 0, body(0))
    assert not any(isinstance(a, Close) for a in d.actions)
    with pytest.raises(RejectedUpload):
        d.upload(1, 2, {"weights": np.ones(3, np.float32), "num_samples": 1})
    d.actions = d.engine.step()
    assert not any(isinstance(a, Close) for a in d.actions)  # 1 still trains
    assert d.engine.buffer_target() == 2
    d.upload(1, 1, body(1))
    assert any(isinstance(a, Close) for a in d.actions)
    assert d.clock.now == 1000.0


def test_a_cannot_train_notice_is_checked_at_decode() -> None:
    raw = Ack(3, "7", 5, "range").encode(RUN)
    assert read_ack(raw, run_id=RUN, round=3, client="7") == Ack(3, "7", 5, "range")
    plain = read_ack(Ack(3, "7", 5).encode(RUN), run_id=RUN, round=3, client="7")
    assert plain.cannot_train == ""
    for body in (
        {"announcement": 5, "cannot_train": ""},
        {"announcement": 5, "cannot_train": "x" * 65},
        {"announcement": 5, "cannot_train": 3},
        {"announcement": 5, "why": "range"},
    ):
        with pytest.raises(WireError):
            read_ack(encode(Message("ack", RUN, 3, "7", body)), run_id=RUN, round=3, client="7")
