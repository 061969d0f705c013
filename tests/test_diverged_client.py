"""A client whose local training diverges refuses its own upload and the run goes on.

Its weights leave the method's bound (or turn non-finite): the client's schema check
refuses to publish them, logs ``upload.refused`` with the reason, rolls back to the state
it had before the round (so the next round does not start from the diverged model) and
does not train that round again when the start is repeated. It tells the coordinator it
cannot train the round (an acknowledgement carrying ``cannot_train``), so each round
closes without it at once, not at its deadline, and every process exits 0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import RUN_ID, Federation, timestamp

pytestmark = pytest.mark.slow


def test_a_diverging_client_refuses_its_upload_and_the_run_completes(
    broker: LocalBroker, tmp_path: Path
) -> None:
    rounds = 2
    with Federation(
        tmp_path,
        broker,
        clients=3,
        rounds=rounds,
        overrides=[
            "method=fedavg",
            "federation.round_timeout_s=60",
            "federation.min_clients=2",
            'federation.device_keys=["train.lr"]',  # the run lets a device set its own
        ],
        client_overrides={"2": ["train.lr=1e12"]},  # one step past any bound
    ) as fed:
        fed.start()
        summary = fed.finish(timeout=120)

    refused = fed.events("2", "upload.refused")
    assert [e["round"] for e in refused] == list(range(1, rounds + 1))  # once per round
    assert all(e["reason"] in ("range", "non_finite") for e in refused), refused
    assert not fed.events("2", "upload.sent")
    assert not fed.events("2", "message.failed")  # refused on purpose, not an error
    for t in range(1, rounds + 1):
        (closed,) = fed.closed_rounds()[t]
        assert closed["missing"] == ["2"], closed
        assert closed["uploads"] == 2
        # closed on client 2's notice, long before the 60 s deadline
        assert timestamp(closed) - max(map(timestamp, fed.started(t))) < 30
    notices = fed.events(event="round.client_refused")
    assert [(e["round"], e["client"]) for e in notices] == [(t, "2") for t in range(1, rounds + 1)]
    assert all(e["reason"].startswith("cannot_train: ") for e in notices), notices
    for healthy in ("0", "1"):
        assert len(fed.events(healthy, "upload.sent")) == rounds
    assert summary["rounds_completed"] == rounds
    # Rolled back each time: no diverged SGD step left a momentum buffer behind.
    state = torch.load(fed.state_dir / RUN_ID / "client-2.pt", weights_only=True)
    assert state["optimizer"]["state"] == {}
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    healthy = torch.load(fed.state_dir / RUN_ID / "client-0.pt", weights_only=True)
    assert healthy["optimizer"]["state"]  # the check above can see a step


async def test_a_client_whose_training_raises_declines_the_round_and_the_run_completes(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training that raises (out of memory, say) is rolled back and the round declined
    at once, as a divergence is: the round closes without the client, not at its deadline.
    The failing client runs in this process, the coordinator and the others as processes."""
    from structlog.testing import capture_logs

    from mqttfl.bus.address import BrokerAddress
    from mqttfl.config import load_config
    from mqttfl.data.sources import run_client_shard
    from mqttfl.nodes.client import ClientRunner

    rounds = 2
    overrides = ["method=fedavg", "federation.round_timeout_s=60", "federation.min_clients=2"]
    with Federation(tmp_path, broker, clients=3, rounds=rounds, overrides=overrides) as fed:
        fed.start_coordinator()
        for cid in ("0", "1"):
            fed.start_client(cid)
        config = load_config(fed.config, fed.all_overrides)
        shard = run_client_shard(config, "2")
        address = BrokerAddress.parse(broker.url)
        runner = ClientRunner(config, "2", address, shard, state_dir=fed.state_dir)

        def failing(t: int, params: object, rng: object) -> float:
            for parameter in runner.model.parameters():  # a step taken before it failed
                parameter.grad = torch.ones_like(parameter)
            runner.method.optimizer.step()
            raise MemoryError("out of memory")

        monkeypatch.setattr(runner.method, "train", failing)
        with capture_logs() as logs:
            code = await runner.run()
        summary = await asyncio.to_thread(fed.finish, timeout=120)

    assert code == 0
    failed = [e for e in logs if e["event"] == "training.failed"]
    assert [e["round"] for e in failed] == list(range(1, rounds + 1)), failed
    assert all(e["error"] == "MemoryError: out of memory" for e in failed)
    assert not [e for e in logs if e["event"] in ("upload.sent", "message.failed")]
    for t in range(1, rounds + 1):
        (closed,) = fed.closed_rounds()[t]
        assert closed["missing"] == ["2"], closed
        assert closed["uploads"] == 2
        assert timestamp(closed) - max(map(timestamp, fed.started(t))) < 30  # not at 60 s
    notices = fed.events(event="round.client_refused")
    assert [(e["round"], e["client"]) for e in notices] == [(t, "2") for t in range(1, rounds + 1)]
    assert {e["reason"] for e in notices} == {"cannot_train: training_failed"}
    assert summary["rounds_completed"] == rounds
    # rolled back each time: the step taken before the failure left no momentum behind
    state = torch.load(fed.state_dir / RUN_ID / "client-2.pt", weights_only=True)
    assert state["optimizer"]["state"] == {}
    assert all(parameter.grad is None for parameter in runner.model.parameters())
