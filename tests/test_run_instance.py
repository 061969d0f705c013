"""A run id started again is a new run instance: a device that kept its state from the
earlier instance sets it aside and trains afresh, and no round waits for it.

As a user does it: run A (a fresh broker, its own ``--out``, clients 0 and 1, 3 rounds)
finishes; run B (another fresh broker, another ``--out``, the same config and run id)
keeps client 0's ``--state-dir`` from run A and gives client 1 a fresh one. Client 0
must train round 1 of run B from a fresh model, say so once, and the run must finish
with no retry and no missing upload (before run instances it acknowledged every start
of round 1 and never trained, so the coordinator waited out each deadline and gave up).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import RUN_ID, Federation

pytestmark = pytest.mark.slow
DEADLINE = ["federation.round_timeout_s=30"]


def test_a_device_state_from_an_earlier_run_of_the_run_id_trains_afresh(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path / "a", broker, clients=2, rounds=3, overrides=DEADLINE) as run_a:
        run_a.start()
        first = run_a.finish(timeout=180)
    assert first["rounds_completed"] == 3
    [trained] = {e["instance"] for e in run_a.events("0", "run.joined")}
    kept = run_a.state_dir / RUN_ID / "client-0.pt"
    assert kept.exists()

    with (
        LocalBroker(tmp_path / "broker-b") as fresh,
        Federation(tmp_path / "b", fresh, clients=2, rounds=3, overrides=DEADLINE) as run_b,
    ):
        (run_b.state_dir / RUN_ID).mkdir(parents=True)
        shutil.copy2(kept, run_b.state_dir / RUN_ID / "client-0.pt")  # client 1: fresh
        run_b.start()
        second = run_b.finish(timeout=180)

    assert second["rounds_completed"] == 3
    assert second["retries"] == 0, second
    assert second["missing_uploads"] == 0, second
    assert run_b.events("0", "client.resumed"), "client 0 did not find run A's state"
    [discarded] = run_b.events("0", "state.discarded")
    assert trained in discarded["reason"]
    assert "started again" in discarded["reason"]
    [joined] = {e["instance"] for e in run_b.events("0", "run.joined")}
    assert joined != trained
    assert [e["round"] for e in run_b.events("0", "upload.sent")][:1] == [1]
    assert not run_b.events("0", "round.declined")
    assert (run_b.state_dir / RUN_ID / "client-0.pt.discarded").exists()
    assert not run_b.events("1", "state.discarded")
