"""What a fleet's idle clients hold: windows spilled to an unnamed file and handed back
after each pass (mqttfl/data/spill.py), and no downlink kept alive while its scoring
waits for a worker (mqttfl/nodes/client.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mqttfl.data.shard import Shard
from mqttfl.data.spill import is_spilled, release, spill
from mqttfl.nodes.fleet import Releasing


def _file_pss_kb() -> int:
    """This process's proportional share of file-backed pages (smaps_rollup's Pss_File)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss_File:"):
            return int(line.split()[1])
    pytest.skip("no Pss_File in /proc/self/smaps_rollup")


def _shard(n: int = 160) -> Shard:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 64, 242)).astype(np.float32)  # 9.9 MB of windows
    y = rng.integers(0, 3, n).astype(np.int64)
    return Shard(x[: n // 2], y[: n // 2], x[n // 2 :], y[n // 2 :], {"source": "test"})


def test_a_spilled_shard_reads_the_same_and_leaves_no_file(tmp_path: Path) -> None:
    shard = _shard()
    spilled = spill(shard, tmp_path)
    assert is_spilled(spilled)
    assert not is_spilled(shard)
    np.testing.assert_array_equal(spilled.x_train, shard.x_train)
    np.testing.assert_array_equal(spilled.x_test, shard.x_test)
    assert spilled.y_train is shard.y_train  # labels stay in memory
    assert list(tmp_path.iterdir()) == []  # the file has no name: nothing to leave behind
    spilled.x_train[0, 0, 0] = 7.0  # a private mapping: writable, and only in this process
    release(spilled)
    assert spilled.x_train[0, 0, 0] == shard.x_train[0, 0, 0]  # read back from the file
    release(shard)  # an in-memory shard: nothing to do


def test_released_windows_leave_the_process_until_read_again(tmp_path: Path) -> None:
    spilled = spill(_shard(), tmp_path)
    size_kb = (spilled.x_train.nbytes + spilled.x_test.nbytes) // 1024
    before = _file_pss_kb()
    total = float(spilled.x_train.sum() + spilled.x_test.sum())  # every page read
    touched = _file_pss_kb()
    release(spilled)
    after = _file_pss_kb()
    assert touched - before > 0.9 * size_kb, (before, touched, size_kb)
    assert touched - after > 0.9 * size_kb, (touched, after, size_kb)
    assert float(spilled.x_train.sum() + spilled.x_test.sum()) == total


def test_a_runners_pass_hands_its_windows_back_when_it_ends(tmp_path: Path) -> None:
    spilled = spill(_shard(), tmp_path)
    size_kb = (spilled.x_train.nbytes + spilled.x_test.nbytes) // 1024
    with ThreadPoolExecutor(1) as pool:
        executor = Releasing(pool, spilled)

        def read_all() -> int:
            float(spilled.x_train.sum() + spilled.x_test.sum())
            return _file_pss_kb()

        before = _file_pss_kb()
        during = executor.submit(read_all).result()
        after = _file_pss_kb()
        executor.shutdown()  # the fleet's pool is not the runner's to stop
        assert pool.submit(lambda: 1).result() == 1
    assert during - before > 0.9 * size_kb
    assert during - after > 0.9 * size_kb


def test_a_fleet_spills_into_its_state_folder_and_trains_as_before(tmp_path: Path) -> None:
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.config import load_config
    from mqttfl.nodes.fleet import Fleet
    from tests.faults import CONFIG

    config = load_config(CONFIG, ["model.name=tiny", "data.samples_per_client=30"])
    fleet = Fleet(
        config, BrokerAddress("127.0.0.1", 1), ["0", "1"], state_dir=tmp_path, credentials={}
    )
    fleet.build()
    assert sorted(fleet.runners) == ["0", "1"]
    assert not fleet.failed
    for runner in fleet.runners.values():
        assert is_spilled(runner.shard)
        assert isinstance(runner.executor, Releasing)
    assert not any(p.is_file() for p in (tmp_path / config.run_id).iterdir())
    fleet.pool.shutdown()


async def test_a_downlink_is_not_held_while_its_scoring_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client applies a downlink, then waits for a worker to score it: the decoded
    downlink is garbage by then (a fleet's clients all wait at the last round, and each
    would otherwise hold its copy of the broadcast)."""
    from mqttfl.algorithms.common.weights import group_key
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.bus.transport import Incoming
    from mqttfl.config import load_config
    from mqttfl.data.sources import run_client_shard
    from mqttfl.nodes.client import ClientRunner
    from mqttfl.wire.downlinks import Downlink
    from tests.faults import CONFIG

    overrides = ["method=fedavg", "model.name=tiny", "data.samples_per_client=30"]
    config = load_config(CONFIG, overrides)
    runner = ClientRunner(
        config,
        "0",
        BrokerAddress("127.0.0.1", 1),
        run_client_shard(config, "0"),
        state_dir=tmp_path,
    )
    weights = np.asarray(runner.method.make_upload(1)["weights"], np.float32)
    body = {"weights": {group_key(runner.info): weights}}
    raw = Downlink(1, body, ()).encode(config.run_id)
    held: list[weakref.ref[Any]] = []
    receive = runner.method.receive
    scoring, alive = threading.Event(), []

    def receiving(t: int, broadcast: Any, personal: Any) -> None:
        held.append(weakref.ref(broadcast["weights"][group_key(runner.info)]))
        receive(t, broadcast, personal)

    def predicting(x: np.ndarray) -> np.ndarray:
        gc.collect()
        alive.append(any(ref() is not None for ref in held))
        scoring.set()
        return np.zeros(len(x), np.int64)

    monkeypatch.setattr(runner.method, "receive", receiving)
    monkeypatch.setattr(runner.method, "predict", predicting)
    runner.rounds.closed_round = 1  # round 1 is known closed: its downlink applies at once
    tasks = [asyncio.create_task(runner._reader()), asyncio.create_task(runner._worker())]
    runner.bus.incoming.put_nowait(Incoming(runner.topics.down_all(1), raw))
    try:
        for _ in range(400):
            if runner.progress.applied_round == 1:
                break
            await asyncio.sleep(0.05)
        assert scoring.is_set()
        assert runner.progress.applied_round == 1
        assert held
        assert alive == [False], (len(held), alive)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
