"""Coordinator crash: SIGKILL it mid-round, restart it on the same run dir."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.config import load_config
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import decode
from tests.faults import RUN_ID, Federation, Seen, Witness, topic_parts

ROUNDS, CRASH_ROUND, CLIENTS = 4, 3, "012"


@pytest.mark.slow
def test_coordinator_sigkill_mid_round_resumes_from_its_journal(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path, broker, clients=len(CLIENTS), rounds=ROUNDS) as fed:
        crashed: list[float] = []

        def crash_on_first_upload(seen: Seen) -> None:
            parts = topic_parts(seen.topic)
            if not crashed and parts[:2] == ["round", str(CRASH_ROUND)] and parts[2] == "up":
                os.killpg(
                    fed.pid("coordinator"), signal.SIGKILL
                )  # the instant an upload is in flight
                crashed.append(seen.at)

        base = f"mqttfl/{RUN_ID}"
        with Witness(
            broker.port,
            [f"{base}/round/+/start", f"{base}/round/+/up/+", f"{base}/round/+/down/all"],
            on_message=crash_on_first_upload,
        ) as witness:
            fed.start()
            client_pids = {cid: fed.pid(cid) for cid in CLIENTS}
            fed.wait_for(
                lambda: crashed, timeout=120, what=f"the first upload of round {CRASH_ROUND}"
            )
            assert fed.procs["coordinator"].wait(timeout=10) == -signal.SIGKILL
            assert fed.last_closed() == CRASH_ROUND - 1
            fed.start_coordinator()  # same --out: resumes from checkpoint.msgpack
            summary = fed.finish(timeout=180)

        assert {cid: fed.pid(cid) for cid in CLIENTS} == client_pids  # nobody restarted
        for cid in CLIENTS:
            assert len(fed.events(cid, "client.started")) == 1
            assert sorted(set(fed.uploads_sent(cid))) == list(range(1, ROUNDS + 1))
        # Whoever had uploaded to the dead coordinator sent the same upload to the new one.
        resent = {
            cid
            for cid in CLIENTS
            if any(e["round"] == CRASH_ROUND for e in fed.events(cid, "upload.resent"))
        }
        assert resent
        assert all(CRASH_ROUND in fed.uploads_sent(cid) for cid in resent)

    events = fed.events()
    resumed = [e for e in events if e["event"] == "run.resumed"]
    assert [e["from_round"] for e in resumed] == [CRASH_ROUND]
    closed = Counter(e["round"] for e in events if e["event"] == "round.closed")
    assert closed == dict.fromkeys(range(1, ROUNDS + 1), 1)  # no round aggregated twice
    # Each round's broadcast is one payload (the resumed coordinator may send round 3's again, byte for byte).
    broadcasts: dict[int, set[bytes]] = {}
    for m in witness.seen(lambda m: bool(m.payload) and m.topic.endswith("/down/all")):
        broadcasts.setdefault(int(topic_parts(m.topic)[1]), set()).add(m.payload)
    assert {t: len(p) for t, p in broadcasts.items()} == dict.fromkeys(range(1, ROUNDS + 1), 1)
    # The resumed round runs with every client and the schedule of its own round number.
    resumed_close = next(
        e for e in events if e["event"] == "round.closed" and e["round"] == CRASH_ROUND
    )
    assert resumed_close["uploads"] == len(CLIENTS)
    assert resumed_close["missing"] == []
    starts = [
        decode(m.payload)
        for m in witness.seen(lambda m: m.topic.endswith(f"/round/{CRASH_ROUND}/start"))
    ]
    assert len(starts) == 2  # once by each coordinator
    config = load_config(fed.config, fed.all_overrides)
    want = get_algorithm(config.method).server(make_context(config)).round_params(CRASH_ROUND)
    assert [s.body["params"] for s in starts] == [want, want]
    # Counters restored from the checkpoint: the summary counts every aggregated upload once.
    before = events[: events.index(resumed[0])]
    after = events[events.index(resumed[0]) :]
    aggregated = [e for e in before if e["event"] == "upload.accepted" and e["round"] < CRASH_ROUND]
    aggregated += [e for e in after if e["event"] == "upload.accepted"]
    assert summary["comm"]["up_bytes_total"] == sum(e["bytes"] for e in aggregated)
    assert summary["rounds_completed"] == ROUNDS
    # The broker kept the coordinator's session: uploads sent to the dead coordinator reach
    # the new one before it reopens the round, are rejected as "future" with a log line,
    # and are then sent again (above); nothing else is rejected.
    assert set(summary["rejections"]) <= {"future"}
    early = [e for e in events if e["event"] == "upload.rejected" and e["reason"] == "future"]
    assert len(early) == summary["rejections"].get("future", 0) <= len(CLIENTS)
    assert all(e["round"] == CRASH_ROUND for e in early)
    assert {r["round"] for r in summary_rows(fed)} == set(range(1, ROUNDS + 1))
    print(f"FIGURES coordinator_restarts_survived=1 rounds={ROUNDS} stalled={fed.stalled_rounds()}")


def summary_rows(fed: Federation) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in (fed.out / "metrics.jsonl").read_text().splitlines()]
