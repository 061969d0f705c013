"""Live: the coordinator killed with ``kill -9`` ten times at random
points, restarted each time on the same ``--out``, and the run still completes with
every round counted once.

The kill points come from a seeded generator: during start-up (imports, the broker
check, the resume that sets leftovers aside), at a random moment of a running round,
and the instant a round's downlinks reach the broker (right after the coordinator
wrote that round's checkpoint). An append of one line is a single ``write``, which a
SIGKILL does not split; so what a kill during that write leaves (a partial last line of
``metrics.jsonl``) is also left by the test itself before two of the restarts.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire.codec import unpack_data
from tests.faults import RUN_ID, Federation, Seen, Witness, read_events, topic_parts, wait_for

ROUNDS, CLIENTS, KILLS, SEED = 20, 2, 10, 30
PARTIAL = b'{"accuracy": 0.5, "bytes_down": 64748, "bytes_up": 135'  # a line cut short
INJECT_BEFORE = {3, 7}  # restarts that find a partial last line


def moment(limit: float, sooner: Callable[[], bool]) -> None:
    """Until ``limit`` (a time.monotonic() value), or sooner."""
    wait_for(lambda: time.monotonic() > limit or sooner(), timeout=60, what="the moment to kill")


@pytest.mark.slow
def test_ten_kill_9_at_random_points_and_the_run_completes_counting_each_round_once(
    broker: LocalBroker, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    kinds = ["startup"] * 2 + ["closed"] * 2 + ["running"] * (KILLS - 4)
    rng.shuffle(kinds)
    with Federation(tmp_path, broker, clients=CLIENTS, rounds=ROUNDS) as fed:
        armed = threading.Event()  # kill at the next round's first broadcast
        fired = threading.Event()
        highest = [0]  # the newest round whose broadcast went out

        def kill_on_downlink(seen: Seen) -> None:
            parts = topic_parts(seen.topic)
            if not seen.payload or parts[2:] != ["down", "all"] or int(parts[1]) <= highest[0]:
                return
            highest[0] = int(parts[1])
            if armed.is_set():
                armed.clear()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(fed.pid("coordinator"), signal.SIGKILL)
                fired.set()

        with Witness(
            broker.port, [f"mqttfl/{RUN_ID}/round/+/down/all"], on_message=kill_on_downlink
        ):
            fed.start()
            for index, kind in enumerate(kinds):
                life = len(fed.events(event="run.started")) + 1

                def started(life: int = life) -> bool:
                    return len(fed.events(event="run.started")) >= life

                if kind == "startup":  # imports, the broker check, the resume
                    moment(time.monotonic() + rng.uniform(0.2, 2.5), started)
                elif kind == "running":  # a random moment of the rounds that follow
                    fed.wait_for(started, timeout=120, what=f"coordinator life {life} to start")

                    def two_more(began: int = highest[0]) -> bool:
                        return highest[0] >= began + 2

                    moment(time.monotonic() + rng.uniform(0.0, 1.5), two_more)
                else:  # the instant a round's checkpoint is written and its downlinks go out
                    fired.clear()
                    armed.set()
                    fed.wait_for(fired.is_set, timeout=120, what=f"a round to close ({life})")
                assert kind == "closed" or fed.alive("coordinator"), (
                    f"the coordinator ended before kill {index + 1}: "
                    f"{fed.procs['coordinator'].returncode}\n{fed.output('coordinator')[-3000:]}"
                )
                fed.kill("coordinator")
                if index + 1 in INJECT_BEFORE:
                    with open(fed.out / "metrics.jsonl", "ab") as handle:
                        handle.write(PARTIAL)
                fed.start_coordinator()
            summary = fed.finish(timeout=300)

    assert len(fed.killed) == KILLS
    assert summary["rounds_completed"] == ROUNDS
    # Every aggregated round counted once: each round closes with both uploads (min_clients
    # is the whole federation), so the final state holds exactly ROUNDS * CLIENTS of them.
    state = unpack_data((fed.out / "checkpoint.msgpack").read_bytes())
    assert state["round"] == ROUNDS
    assert state["comm"]["up_count"] == ROUNDS * CLIENTS
    closed = Counter(e["round"] for e in fed.events(event="round.closed"))
    assert all(n == 1 for n in closed.values()), closed
    # metrics.jsonl: whole lines only, each (round, client) once.
    lines = read_events(fed.out / "metrics.jsonl")
    raw = (fed.out / "metrics.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    assert len(lines) == raw.count(b"\n")
    pairs = Counter((r["round"], r["client_id"]) for r in lines)
    assert pairs, "no metrics"
    assert max(pairs.values()) == 1, pairs.most_common(3)
    assert ROUNDS in {t for t, _ in pairs}  # the last round's, which the run waits for
    # What the kills left was set aside, not lost and not appended to.
    set_aside = [
        e for e in fed.events(event="journal.tail_set_aside") if e["path"].endswith("metrics.jsonl")
    ]
    kept = b"".join(p.read_bytes() for p in fed.out.glob("metrics.jsonl.partial-*"))
    assert set_aside  # (two tails may be set aside at once, if a start-up kill came between)
    assert PARTIAL not in raw
    # (a kill while setting a tail aside may leave a second copy of it: never fewer)
    assert kept.count(PARTIAL) >= len(INJECT_BEFORE)
    print(
        f"FIGURES kills={len(fed.killed)} kinds={dict(Counter(kinds))} "
        f"coordinator_starts={fed.starts['coordinator']} tails_set_aside={len(set_aside)} "
        f"resumed={len(fed.events(event='run.resumed'))}"
    )
