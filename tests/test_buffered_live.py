"""Buffered mode (FedBuff) live: real client processes and a real coordinator on a real
Mosquitto; a client killed with ``kill -9`` and restarted, the coordinator killed and
restarted on its run dir, and an upload older than ``max_staleness`` versions."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from mqttfl.engine.journal import read_checkpoint
from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import Federation

BUFFERED = [
    "federation.mode=buffered",
    "federation.buffer_size=2",
    "federation.max_staleness=2",
    "federation.round_timeout_s=30",
]


def buffered(tmp_path: Path, broker: LocalBroker, *extra: str, rounds: int = 30) -> Federation:
    return Federation(tmp_path, broker, clients=3, rounds=rounds, overrides=[*BUFFERED, *extra])


@pytest.mark.slow
def test_a_killed_client_leaves_by_its_will_and_rejoins_with_its_state(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with buffered(tmp_path, broker) as fed:
        fed.start()
        fed.wait_round_closed(2)
        fed.kill("2")
        fed.wait_for(
            lambda: any(e["client"] == "2" for e in fed.events(event="client.offline")),
            timeout=30,
            what="client 2's last will",
        )
        gone = fed.last_closed()
        fed.wait_round_closed(gone + 1)  # the two others fill the buffer on their own
        fed.restart("2")
        fed.wait_for(lambda: fed.events("2", "client.resumed"), timeout=60, what="a resume")
        summary = fed.finish(timeout=120)
    assert summary["rounds_completed"] == 30
    assert sorted(fed.closed_rounds()) == list(range(1, 31))
    assert all(len(closes) == 1 for closes in fed.closed_rounds().values())
    back = fed.events("2", "client.resumed")[-1]
    assert back["trained_round"] >= 1  # it came back with what it had trained
    after = [r for (r, c), what in fed.outcomes().items() if c == "2" and "accepted" in what]
    assert max(after) > gone  # and its work counted again after its return
    assert summary["buffered"]["versions"] == 30


@pytest.mark.slow
def test_a_restarted_coordinator_goes_on_from_its_version_and_buffer(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with buffered(tmp_path, broker) as fed:
        fed.start()
        fed.wait_round_closed(3)
        fed.kill("coordinator")
        saved = read_checkpoint(fed.out / "checkpoint.msgpack")
        assert saved["round"] >= 3
        assert "buffered" in saved
        fed.restart("coordinator")
        summary = fed.finish(timeout=120)
    resumed = fed.events(event="run.resumed")
    assert resumed
    assert resumed[0]["from_round"] == saved["round"] + 1
    assert sorted(fed.closed_rounds()) == list(range(1, 31))
    assert all(len(closes) == 1 for closes in fed.closed_rounds().values())
    assert summary["rounds_completed"] == 30
    # every aggregated upload is counted once across the two lives of the coordinator
    counted = sum(summary["buffered"]["staleness"].values())
    assert counted == sum(e["uploads"] for closes in fed.closed_rounds().values() for e in closes)


@pytest.mark.slow
def test_an_upload_older_than_max_staleness_is_rejected_with_its_reason(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with buffered(tmp_path, broker, "federation.max_staleness=1") as fed:
        fed.start()
        fed.wait_round_closed(1)

        def started_since(seen: int) -> list[dict[str, Any]]:
            return fed.events("2", "training.started")[seen:]

        def outcome_of(t: int) -> list[str] | None:
            return fed.outcomes().get((t, "2"))

        t = 0
        for _ in range(5):  # a short training can upload before the pause lands: try again
            seen = len(fed.events("2", "training.started"))
            began = fed.wait_for(
                partial(started_since, seen), timeout=60, what="client 2 to start a training"
            )
            t = int(began[0]["round"])
            fed.stop("2")  # a slow device: paused mid-training while the others go on
            fed.wait_round_closed(t + 2, timeout=60)
            fed.cont("2")
            outcome = fed.wait_for(partial(outcome_of, t), timeout=60, what="client 2's upload")
            if "upload.rejected:too_stale" in outcome:
                break
        summary = fed.finish(timeout=120)
    rejected = [e for e in fed.events(event="upload.rejected") if e["reason"] == "too_stale"]
    assert any(e["client"] == "2" and e["round"] == t for e in rejected)
    assert summary["rejections"]["too_stale"] >= 1
    assert all(int(tau) <= 1 for tau in summary["buffered"]["staleness"])
    assert summary["rounds_completed"] == 30
    # back, it skipped the starts that queued up while it was paused: the newest version
    trained = [e["round"] for e in fed.events("2", "training.started")]
    assert trained[trained.index(t) + 1] >= t + 2


@pytest.mark.slow
def test_uploads_in_flight_across_coordinator_kills_are_neither_lost_nor_counted_twice(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """The coordinator is killed with kill -9 ten times while versions close and clients
    keep uploading: uploads the broker queued across each crash reach the new coordinator
    before their senders' statuses, and are held for them rather than refused."""
    with buffered(tmp_path, broker, rounds=34) as fed:
        fed.start()
        for version in range(3, 31, 3):
            fed.wait_round_closed(version, timeout=120)
            fed.kill("coordinator")
            fed.restart("coordinator")
        summary = fed.finish(timeout=240)
    assert summary["rounds_completed"] == 34
    assert all(len(closes) == 1 for closes in fed.closed_rounds().values())
    assert "unknown_client" not in summary["rejections"], summary["rejections"]
    counted = sum(summary["buffered"]["staleness"].values())
    assert counted == sum(e["uploads"] for closes in fed.closed_rounds().values() for e in closes)
