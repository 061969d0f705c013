"""A device whose wall clock is ten minutes off still trains every round.

The client processes run under libfaketime (``FAKETIME``), which shifts their wall clock
only; their monotonic clock stays true, as on a Raspberry Pi without RTC or NTP. Rounds
carry a relative ``timeout_s``, so nothing compares clocks across machines.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import Federation, timestamp

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
SKEWS = {"0": "+600s", "1": "-600s"}  # ±10 minutes
ROUNDS = 3


@pytest.mark.slow
def test_clients_with_skewed_wall_clocks_train_every_round(
    broker: LocalBroker, tmp_path: Path
) -> None:
    assert LIBFAKETIME, "libfaketime is missing: scripts/setup.sh installs the faketime package"
    with Federation(tmp_path, broker, clients=3, rounds=ROUNDS) as fed:
        fed.start_coordinator()
        for cid in ("0", "1", "2"):
            skew = SKEWS.get(cid)
            env = {}
            if skew:
                env = {
                    "LD_PRELOAD": LIBFAKETIME[0],
                    "FAKETIME": skew,
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                }
            fed.start_client(cid, env=env)
        summary = fed.finish(timeout=240)
    # The skew was real: each skewed client stamped its log ~10 minutes off the coordinator.
    reference = timestamp(fed.events("2", "client.started")[0])
    for cid, skew in SKEWS.items():
        offset = timestamp(fed.events(cid, "client.started")[0]) - reference
        assert abs(offset - float(skew.rstrip("s"))) < 60, (cid, offset)
    for cid in ("0", "1", "2"):
        assert fed.events(cid, "round.skipped") == []
        assert sorted(set(fed.uploads_sent(cid))) == list(range(1, ROUNDS + 1))
    assert summary["rounds_completed"] == ROUNDS
    assert summary["missing_uploads"] == 0
    assert fed.stalled_rounds() == []
