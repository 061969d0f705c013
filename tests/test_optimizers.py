"""The package's SGD and Adam against ``torch.optim``'s, step for step, to the bit; their
state dicts in torch's layout both ways; and a client's training without torch's compiler."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mqttfl.models import EmbeddingModel, build_model
from mqttfl.training.optimizers import SGD, Adam, Optimizer

REPO = Path(__file__).resolve().parents[1]

SGD_SETTINGS: list[dict[str, Any]] = [
    {"lr": 0.05},
    {"lr": 0.01, "momentum": 0.5, "weight_decay": 1e-5},  # the default [train]
    {"lr": 0.02, "momentum": 0.9, "dampening": 0.1},
    {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
]
ADAM_SETTINGS: list[dict[str, Any]] = [
    {"lr": 3e-3},
    {"lr": 1e-4, "weight_decay": 1e-5},
    {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6},
]


def _twins() -> tuple[EmbeddingModel, EmbeddingModel]:
    torch.manual_seed(3)
    one = build_model("tiny", num_classes=4, embed_dim=8)
    two = build_model("tiny", num_classes=4, embed_dim=8)
    two.load_state_dict(one.state_dict())
    return one, two


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(7)
    return [
        (
            torch.from_numpy(rng.normal(size=(6, 8, 6)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 4, size=6)),
        )
        for _ in range(steps)
    ]


def _step(model: torch.nn.Module, optimizer: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    logits, _ = model(x)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(logits, y).backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def _pairs() -> list[tuple[Callable[..., Optimizer], Callable[..., Any], dict[str, Any]]]:
    return [(SGD, torch.optim.SGD, s) for s in SGD_SETTINGS] + [
        (Adam, torch.optim.Adam, s) for s in ADAM_SETTINGS
    ]


@pytest.mark.parametrize(("ours", "theirs", "settings"), _pairs())
def test_each_step_equals_torch_optim_to_the_bit(
    ours: Callable[..., Optimizer], theirs: Callable[..., Any], settings: dict[str, Any]
) -> None:
    a, b = _twins()
    mine = ours(a.parameters(), **settings)
    reference = theirs(b.parameters(), **settings)
    for x, y in _batches(6):
        _step(a, mine, x, y)
        _step(b, reference, x, y)
        _assert_same(a, b)
    assert any(p.grad is not None for p in a.parameters())  # the last step's stay
    mine.zero_grad()
    assert all(p.grad is None for p in a.parameters())


@pytest.mark.parametrize(("ours", "theirs", "settings"), _pairs())
def test_state_dicts_load_into_either(
    ours: Callable[..., Optimizer], theirs: Callable[..., Any], settings: dict[str, Any]
) -> None:
    """Three steps in one, its state dict loaded into the other, three more: the same bits
    as six steps in torch alone, in both directions; the layouts have the same keys."""
    batches = _batches(6)
    alone, _ = _twins()
    reference = theirs(alone.parameters(), **settings)
    for x, y in batches:
        _step(alone, reference, x, y)

    for first, second in ((ours, theirs), (theirs, ours)):
        a, b = _twins()
        before = first(a.parameters(), **settings)
        for x, y in batches[:3]:
            _step(a, before, x, y)
        saved = before.state_dict()
        b.load_state_dict(a.state_dict())
        after = second(b.parameters(), **settings)
        after.load_state_dict(saved)
        for x, y in batches[3:]:
            _step(b, after, x, y)
        _assert_same(b, alone)

    a, b = _twins()
    mine = ours(a.parameters(), **settings)
    reference = theirs(b.parameters(), **settings)
    for x, y in batches[:2]:
        _step(a, mine, x, y)
        _step(b, reference, x, y)
    mine_sd, torch_sd = mine.state_dict(), reference.state_dict()
    assert set(mine_sd) == set(torch_sd) == {"state", "param_groups"}
    assert {k: set(v) for k, v in mine_sd["state"].items()} == {
        k: set(v) for k, v in torch_sd["state"].items()
    }
    assert [g["params"] for g in mine_sd["param_groups"]] == [
        g["params"] for g in torch_sd["param_groups"]
    ]
    assert set(mine_sd["param_groups"][0]) <= set(torch_sd["param_groups"][0])


def test_a_loaded_state_is_copied_so_a_snapshot_can_be_loaded_twice() -> None:
    a, _ = _twins()
    optimizer = SGD(a.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(2):
        _step(a, optimizer, x, y)
    saved = optimizer.state_dict()
    kept = {k: v["momentum_buffer"].clone() for k, v in saved["state"].items()}
    optimizer.load_state_dict(saved)
    for x, y in _batches(2):
        _step(a, optimizer, x, y)
    for k, v in saved["state"].items():
        assert torch.equal(v["momentum_buffer"], kept[k])


def test_a_second_group_and_its_own_learning_rate_follow_torch() -> None:
    """As FedPAM adds its matrix: a group added after construction, then every group's lr
    changed in place."""
    a, b = _twins()
    extra_a = torch.nn.Parameter(torch.eye(8))
    extra_b = torch.nn.Parameter(torch.eye(8))
    mine = SGD(a.parameters(), lr=0.05, momentum=0.5)
    reference = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.5)
    mine.add_param_group({"params": [extra_a]})
    reference.add_param_group({"params": [extra_b]})
    for group in mine.param_groups:
        group["lr"] = 0.003
    for torch_group in reference.param_groups:
        torch_group["lr"] = 0.003
    for x, y in _batches(3):
        for model, optimizer, extra in ((a, mine, extra_a), (b, reference, extra_b)):
            _, z = model(x)
            optimizer.zero_grad()
            (F.cross_entropy(model.classifier(z @ extra), y)).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        _assert_same(a, b)
        assert torch.equal(extra_a, extra_b)
    with pytest.raises(ValueError, match="more than one group"):
        mine.add_param_group({"params": [extra_a]})


def test_a_state_of_other_groups_is_refused() -> None:
    a, b = _twins()
    saved = SGD(a.parameters(), lr=0.1).state_dict()
    other = SGD(b.parameters(), lr=0.1)
    other.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(ValueError, match="other parameter groups"):
        other.load_state_dict(saved)


TRAIN_EVERY_METHOD = """
import sys
from mqttfl.algorithms import algorithm_names
from tests.inprocess import Federation

trained = []
for name in algorithm_names():
    fed = Federation(name, clients=2, rounds=2, arch="transformer" if name == "fedali" else "middle")
    fed.run()
    trained.append(name)
assert "torch" in sys.modules
print(",".join(trained), "torch._dynamo" in sys.modules)
"""


def test_clients_of_every_method_train_without_torchs_compiler() -> None:
    """Two rounds of every registered method, in a fresh process: torch's compiler stack
    (which ``torch.optim`` imports on first use) is never imported."""
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_EVERY_METHOD],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    trained, dynamo = done.stdout.splitlines()[-1].split()
    assert {"fedapa", "fedali", "fedavg"} <= set(trained.split(","))
    assert dynamo == "False"
