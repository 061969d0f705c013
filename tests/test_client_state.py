"""A device's saved state belongs to its run.

One device (two client processes sharing one ``--state-dir``) takes part in run A
(tiny model), then run B (large model), then run C (A's config under another run id),
then A's run id again with another model: it trains and uploads every round of every
run, never crashes on the state another run left, and a restart inside A resumes at
A's round. The file-level checks (unreadable, older format, another owner) run in
process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from mqttfl.config import load_config
from mqttfl.nodes.client_state import (
    Owner,
    Progress,
    Snapshot,
    StateFile,
    state_path,
    training_digest,
)
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire.schemas import ClientInfo
from tests.faults import CONFIG, Federation

pytestmark = pytest.mark.slow


@dataclass
class SharedStateFederation(Federation):
    """A federation whose clients keep their state in a directory shared across runs."""

    shared_state: Path = field(default_factory=Path)

    @property
    def state_dir(self) -> Path:
        return self.shared_state


def _run(
    root: Path, broker: LocalBroker, state: Path, overrides: list[str], *, rounds: int
) -> SharedStateFederation:
    fed = SharedStateFederation(
        root, broker, clients=2, rounds=rounds, overrides=overrides, shared_state=state
    )
    return fed


def _check_every_round(fed: Federation, rounds: int) -> None:
    for t in range(1, rounds + 1):
        (closed,) = fed.closed_rounds()[t]
        assert closed["uploads"] == 2, closed
        assert closed["missing"] == [], closed
    for cid in ("0", "1"):
        sent = fed.uploads_sent(cid) + [int(e["round"]) for e in fed.events(cid, "upload.resent")]
        assert set(sent) == set(range(1, rounds + 1)), (cid, sent)
        assert not fed.events(cid, "round.skipped")
        assert not fed.events(cid, "client.failed")
        assert not fed.events(cid, "message.failed")


def test_one_device_three_runs_each_with_its_own_state(broker: LocalBroker, tmp_path: Path) -> None:
    state = tmp_path / "device-state"
    rounds = 4
    # Run A (tiny); client 0 is killed after round 2 and restarted: it resumes there.
    with _run(tmp_path / "A", broker, state, ["run_id=run-a"], rounds=rounds) as fed:
        fed.start()
        fed.wait_for(
            lambda: any(e["round"] == 2 for e in fed.events("0", "round.evaluated")),
            timeout=90,
            what="client 0 to apply round 2",
        )
        fed.kill("0")
        fed.restart("0")
        summary = fed.finish(timeout=120)
    assert summary["rounds_completed"] == rounds
    (resumed,) = fed.events("0", "client.resumed")
    assert resumed["trained_round"] >= 2
    assert resumed["applied_round"] >= 1
    _check_every_round(fed, rounds)
    assert not fed.events("0", "state.discarded")
    a_state = torch.load(state_path(state, "run-a", "0"), weights_only=True)
    assert a_state["trained_round"] == rounds
    assert a_state["owner"]["arch"] == "tiny"

    # Run B (large, its own run id): the same device, fresh state of its own.
    b = ["run_id=run-b", "model.name=large"]
    with _run(tmp_path / "B", broker, state, b, rounds=2) as fed:
        fed.start()
        fed.finish(timeout=180)
    _check_every_round(fed, 2)
    for cid in ("0", "1"):
        assert not fed.events(cid, "client.resumed")

    # Run C: A's config under another run id trains every round (A's state is A's).
    with _run(tmp_path / "C", broker, state, ["run_id=run-c"], rounds=rounds) as fed:
        fed.start()
        fed.finish(timeout=120)
    _check_every_round(fed, rounds)
    for cid in ("0", "1"):
        assert not fed.events(cid, "client.resumed")
    # A, B and C each left their own state; nothing was set aside.
    for run in ("run-a", "run-b", "run-c"):
        assert state_path(state, run, "1").exists()
    assert not list(state.rglob("*.discarded"))

    # A's run id again, with another model: A's state is set aside, once, with the reason.
    # On a fresh broker: this one holds run-a's finished state, which a coordinator refuses
    # to run over (tests/test_deploy_mistakes.py); the device and its state are the same.
    with (
        LocalBroker(tmp_path / "broker-2") as broker_2,
        _run(
            tmp_path / "A2", broker_2, state, ["run_id=run-a", "model.name=middle"], rounds=2
        ) as fed,
    ):
        fed.start()
        fed.finish(timeout=120)
    _check_every_round(fed, 2)
    for cid in ("0", "1"):
        (discarded,) = fed.events(cid, "state.discarded")
        assert "arch 'tiny'" in discarded["reason"], discarded
        assert not fed.events(cid, "client.resumed")
    assert state_path(state, "run-a", "0").with_suffix(".pt.discarded").exists()


# --- the file alone -----------------------------------------------------------------------
def _owner(*overrides: str) -> Owner:
    config = load_config(CONFIG, list(overrides))
    info = ClientInfo("0", "tiny", (0, 1), 60, (24, 30))
    return Owner.of(config, info)


def test_the_training_digest_follows_what_decides_training() -> None:
    info = ClientInfo("0", "tiny", (0, 1), 60, (24, 30))
    base = load_config(CONFIG, [])
    same = load_config(CONFIG, ["train.torch_threads=2", "federation.round_timeout_s=5"])
    assert training_digest(same, info) == training_digest(base, info)
    for change in ("train.lr=0.5", "seed=3", "data.window=32", "model.embed_dim=8", "rounds=2"):
        assert training_digest(load_config(CONFIG, [change]), info) != training_digest(
            base, info
        ), change


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"not a torch file", "unreadable"),
        ({"model": {}, "trained_round": 60, "applied_round": 60}, "older format"),
        (
            {"owner": {"run_id": "other", "method": "fedapa", "arch": "tiny", "config": "x"}},
            "run id",
        ),
    ],
)
def test_a_state_that_is_not_this_runs_is_set_aside(
    tmp_path: Path, content: Any, reason: str
) -> None:
    path = state_path(tmp_path, "fedapa-csi", "0")
    path.parent.mkdir(parents=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    from structlog.testing import capture_logs

    progress = Progress()
    with capture_logs() as logs:
        loaded = StateFile(path, _owner()).load(torch.nn.Linear(1, 1), cast(Any, None), progress)
    assert not loaded
    assert progress.trained_round == 0
    (event,) = [e for e in logs if e["event"] == "state.discarded"]
    assert reason in event["reason"]
    assert not path.exists()
    assert path.with_name(path.name + ".discarded").exists()


def test_the_fresh_state_is_built_again_as_the_client_was_built(tmp_path: Path) -> None:
    """A client keeps no copy of its initial model: the state it starts afresh from is
    built again when needed, and is the model it was built with (``config.seed``)."""
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.data.sources import run_client_shard
    from mqttfl.nodes.client import ClientRunner

    config = load_config(CONFIG, ["model.name=tiny", "data.samples_per_client=30"])
    shard = run_client_shard(config, "0")
    runner = ClientRunner(config, "0", BrokerAddress("127.0.0.1", 1), shard, state_dir=tmp_path)
    initial = {k: v.clone() for k, v in runner.model.state_dict().items()}
    assert runner.state_file.fresh is not None
    with torch.no_grad():
        for parameter in runner.model.parameters():
            parameter.add_(1.0)  # as training moves it
    runner.progress.trained_round = runner.progress.applied_round = 4
    fresh = runner.state_file.fresh()
    assert fresh["model"].keys() == initial.keys()
    assert all(torch.equal(fresh["model"][k], initial[k]) for k in initial)
    assert (fresh["trained_round"], fresh["applied_round"], fresh["instance"]) == (0, 0, "")
    StateFile.restore(fresh, runner.model, runner.method, runner.progress)
    assert all(torch.equal(runner.model.state_dict()[k], initial[k]) for k in initial)
    assert runner.progress.trained_round == 0


def test_a_state_that_does_not_load_puts_back_what_the_owner_builds(tmp_path: Path) -> None:
    path = state_path(tmp_path, "fedapa-csi", "0")
    path.parent.mkdir(parents=True)
    model = torch.nn.Linear(1, 1)

    @dataclass
    class Method:  # what restore() touches of a method's client side
        optimizer: torch.optim.Optimizer = field(
            default_factory=lambda: torch.optim.SGD(model.parameters(), lr=0.1)
        )

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    method = Method()
    saved = StateFile.snapshot(model, cast(Any, method), Progress(trained_round=3))
    torch.save({**saved, "model": {"weight": torch.zeros(3, 3), "bias": torch.zeros(3)}}, path)
    built: list[int] = []

    def fresh() -> Snapshot:
        built.append(1)
        state = StateFile.snapshot(model, cast(Any, method), Progress())
        return {**state, "model": {k: torch.full_like(v, 7.0) for k, v in state["model"].items()}}

    state_file = StateFile(path)
    state_file.fresh = fresh
    progress = Progress()
    assert not state_file.load(model, cast(Any, method), progress)  # a size mismatch
    assert built == [1]
    assert all(bool(v.eq(7.0).all()) for v in model.state_dict().values())
    assert progress.trained_round == 0
    assert path.with_name(path.name + ".discarded").exists()


async def test_a_process_holds_a_bounded_number_of_state_snapshots_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a run's last round every runner of a fleet saves at once: the snapshots (each
    a copy of a model and its optimizer) wait for a slot, the state written is the one
    each had when its save returned, and every file is written."""
    import asyncio
    import threading

    from mqttfl.nodes import client_state

    model = torch.nn.Linear(2, 1)

    @dataclass
    class Method:
        optimizer: torch.optim.Optimizer = field(
            default_factory=lambda: torch.optim.SGD(model.parameters(), lr=0.1)
        )

        def state_dict(self) -> dict[str, Any]:
            return {}

    gate, lock = threading.Event(), threading.Lock()
    alive, most = 0, 0
    snapshot, write = StateFile.snapshot, StateFile._write

    def counted_snapshot(*args: Any) -> Snapshot:
        nonlocal alive, most
        with lock:
            alive += 1
            most = max(most, alive)
        return snapshot(*args)

    def held_write(self: StateFile, state: Snapshot) -> None:
        nonlocal alive
        gate.wait(10)
        write(self, state)
        with lock:
            alive -= 1

    monkeypatch.setattr(StateFile, "snapshot", staticmethod(counted_snapshot))
    monkeypatch.setattr(StateFile, "_write", held_write)
    files = [StateFile(state_path(tmp_path, "run", str(i))) for i in range(12)]
    saves = [
        asyncio.ensure_future(f.save(model, cast(Any, Method()), Progress(applied_round=i)))
        for i, f in enumerate(files)
    ]
    await asyncio.sleep(0.2)
    assert most == client_state.WRITES_IN_FLIGHT  # the others wait for a slot
    assert sum(s.done() for s in saves) == client_state.WRITES_IN_FLIGHT
    gate.set()
    await asyncio.gather(*saves)
    for f in files:
        await f.written()
    assert most == client_state.WRITES_IN_FLIGHT
    for i, f in enumerate(files):
        assert torch.load(f.path, weights_only=True)["applied_round"] == i
