"""Bounded evaluation batches: every pass over a shard but training is batched
so that its activations stay under a budget, and the answers do not change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from mqttfl.models import EmbeddingModel, build_model
from mqttfl.training import memory
from mqttfl.training.loops import embed_all, predict_logits, train_epochs
from mqttfl.training.memory import (
    EVAL_ACTIVATION_BYTES,
    MAX_EVAL_BATCH,
    IdleRelease,
    eval_batch_size,
    largest_activation,
    memory_in_use,
    release,
    resident_mb,
)
from mqttfl.training.optimizers import SGD


def _model(arch: str) -> EmbeddingModel:
    torch.manual_seed(0)
    return build_model(arch, num_classes=21, embed_dim=256, input_dim=None)


def test_the_largest_activation_is_the_first_block_of_a_convnet4() -> None:
    # 64x242 through a 3x3 stride-2 convolution with padding 1: 32x121 per channel
    assert largest_activation(_model("middle"), (64, 242)) == 16 * 32 * 121
    assert largest_activation(_model("tiny"), (64, 242)) == 256 * 32 * 121
    assert largest_activation(_model("large"), (50, 51)) == 16 * 25 * 26


def test_the_eval_batch_keeps_two_largest_activations_under_the_budget() -> None:
    per_sample = 2 * 4 * 16 * 32 * 121  # float32, a layer's input and output
    assert eval_batch_size(_model("middle"), (64, 242)) == EVAL_ACTIVATION_BYTES // per_sample
    assert eval_batch_size(_model("tiny"), (64, 242)) == EVAL_ACTIVATION_BYTES // (16 * per_sample)
    assert eval_batch_size(_model("middle"), (8, 8)) == MAX_EVAL_BATCH  # small windows: capped


def test_measuring_does_not_touch_the_model() -> None:
    model = _model("middle")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eval_batch_size(model, (64, 242))
    assert model.training
    for key, value in model.state_dict().items():  # BatchNorm statistics included
        assert torch.equal(value, before[key]), key


def test_bounded_batches_give_the_answers_one_big_batch_gives() -> None:
    model = _model("tiny")
    x = np.random.default_rng(0).normal(size=(9, 64, 242)).astype(np.float32)
    assert eval_batch_size(model, x.shape[1:]) < len(x)
    bounded = predict_logits(model, x)
    whole = predict_logits(model, x, batch_size=len(x))
    np.testing.assert_allclose(bounded, whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(embed_all(model, x), embed_all(model, x, batch_size=len(x)), 1e-5)


def test_release_and_resident_figures() -> None:
    release()
    rss, peak = resident_mb()
    assert 0 < rss <= peak


def test_training_leaves_no_gradients_held() -> None:
    """A client waits most of a round: its gradients (a model's worth) are freed when its
    training ends, and the next training step makes them again."""
    model = _model("tiny")
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 64, 242)).astype(np.float32)
    y = rng.integers(0, 21, size=8)

    def loss_fn(
        logits: torch.Tensor, embedding: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, labels)

    before = [p.detach().clone() for p in model.parameters()]
    train_epochs(model, optimizer, x, y, loss_fn, epochs=1, batch_size=4, rng=rng)
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert optimizer.state  # the momentum stays: it is the method's state, not a temporary


async def test_the_heap_goes_back_only_after_the_process_has_idled() -> None:
    """Passes that follow each other closer than ``after_s`` (a client that works every
    round) release nothing between them; one quiet stretch releases once."""
    idle = IdleRelease(after_s=1.0, in_use=lambda: 0.1)

    async def released_within(seconds: float) -> bool:
        for _ in range(int(seconds / 0.05)):
            if idle.releases:
                return True
            await asyncio.sleep(0.05)
        return bool(idle.releases)

    for _ in range(4):  # four passes, 0.05 s apart
        idle.begin()
        await asyncio.sleep(0.01)
        idle.end()
        await asyncio.sleep(0.05)
    assert idle.releases == 0
    idle.begin()
    idle.begin()  # two passes at once (a fleet's runners): the first to end releases nothing
    idle.end()
    await asyncio.sleep(1.3)
    assert idle.releases == 0
    idle.end()
    assert await released_within(5.0)
    await asyncio.sleep(1.3)
    assert idle.releases == 1  # once per quiet stretch, not every after_s


async def test_where_memory_is_short_the_heap_goes_back_as_the_last_pass_ends() -> None:
    in_use = [0.6]
    idle = IdleRelease(after_s=60.0, in_use=lambda: in_use[0])
    idle.begin()
    idle.begin()
    idle.end()
    assert idle.releases == 0  # another pass still runs
    idle.end()
    assert idle.releases == 1
    in_use[0] = 0.4
    idle.begin()
    idle.end()
    assert idle.releases == 1  # room to spare: it waits for a quiet minute
    idle.begin()  # and a pass cancels that wait


def _meminfo(tmp_path: Path, total_kb: int, available_kb: int) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:         1 kB\nMemAvailable:   {available_kb} kB\n"
    )
    return proc


def test_memory_in_use_is_the_host_share_or_the_cgroup_share_whichever_is_larger(
    tmp_path: Path,
) -> None:
    proc = _meminfo(tmp_path, 1000, 700)  # the host: 30 % in use
    cgroups = tmp_path / "cgroup"
    board = cgroups / "memory" / "boards" / "b1"
    board.mkdir(parents=True)
    (board / "memory.limit_in_bytes").write_text("536870912\n")  # 512 MB
    (board / "memory.usage_in_bytes").write_text("402653184\n")  # 384 MB: 75 %
    (proc / "self" / "cgroup").write_text("5:cpuset:/boards/b1\n4:memory:/boards/b1\n0::/\n")
    assert memory_in_use(proc, cgroups) == 0.75
    (board / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    assert memory_in_use(proc, cgroups) == pytest.approx(0.3)
    # cgroup v2: memory.max and memory.current
    unified = cgroups / "svc"
    unified.mkdir()
    (unified / "memory.max").write_text("1000\n")
    (unified / "memory.current").write_text("900\n")
    (proc / "self" / "cgroup").write_text("0::/svc\n")
    assert memory_in_use(proc, cgroups) == 0.9
    (unified / "memory.max").write_text("max\n")
    assert memory_in_use(proc, cgroups) == pytest.approx(0.3)
    assert memory_in_use(tmp_path / "nowhere", cgroups) == 0.0  # nothing readable


async def test_a_runner_pass_holds_off_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pass a runner runs off its event loop counts as the process's work."""
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.config import load_config
    from mqttfl.data.sources import run_client_shard
    from mqttfl.nodes.client import ClientRunner
    from tests.faults import CONFIG

    config = load_config(CONFIG, ["model.name=tiny", "data.samples_per_client=30"])
    runner = ClientRunner(
        config,
        "0",
        BrokerAddress("127.0.0.1", 1),
        run_client_shard(config, "0"),
        state_dir=tmp_path,
    )
    monkeypatch.setattr(memory.IDLE, "in_use", lambda: 0.0)  # the host has memory to spare
    seen = await runner._off_loop(lambda: memory.IDLE.running)
    assert seen == 1
    assert memory.IDLE.running == 0
    assert memory.IDLE._timer is not None  # the release waits for the quiet stretch
