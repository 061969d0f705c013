"""The pooled (centralized) reference and its row in `mqttfl compare`'s table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mqttfl.config import TrainConfig, load_config
from mqttfl.data.shard import Shard
from mqttfl.engine.documents import CompareRow
from mqttfl.evaluation.compare_entries import pooled_overrides
from mqttfl.evaluation.compare_report import aggregate_pooled, markdown_table
from mqttfl.evaluation.pooled import (
    POOLED_STREAM,
    PooledRun,
    pool_training_data,
    pooled_reference,
    pooling_obstacle,
    run_pooled,
    score_per_client,
    train_pooled,
)
from mqttfl.models import build_model
from mqttfl.training.loops import predict_logits

TRAIN = TrainConfig(lr=0.05, momentum=0.5, weight_decay=1e-4, batch_size=6)


def toy(index: int, *, n: int = 12, subcarriers: int = 6) -> Shard:
    rng = np.random.default_rng([index, 3])
    y = rng.integers(0, 3, size=n + 6).astype(np.int64)
    x = (rng.normal(size=(n + 6, 8, subcarriers)) + y[:, None, None]).astype(np.float32)
    return Shard(x[:n], y[:n], x[n:], y[n:], {"source": "toy"})


SHARDS = {str(i): toy(i) for i in range(3)}


def test_pooled_equals_one_model_trained_on_the_concatenated_shards() -> None:
    """Same seed, same batches: 3 epochs over the 36 concatenated training samples in the
    order of rng([seed, POOLED_STREAM]).permutation, SGD from TrainConfig, plain CE."""
    x, y = pool_training_data(list(SHARDS.values()))
    pooled = train_pooled(
        x, y, arch="tiny", num_classes=3, embed_dim=4, train=TRAIN, epochs=3, seed=5
    )

    expected_x = np.concatenate([SHARDS[c].x_train for c in "012"])
    expected_y = np.concatenate([SHARDS[c].y_train for c in "012"])
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, expected_y)
    torch.manual_seed(5)
    model = build_model("tiny", num_classes=3, embed_dim=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5, weight_decay=1e-4)
    rng = np.random.default_rng([5, POOLED_STREAM])
    model.train()
    for _ in range(3):
        order = rng.permutation(36)
        for start in range(0, 36, 6):
            batch = order[start : start + 6]
            logits, _ = model(torch.from_numpy(expected_x[batch]))
            loss = F.cross_entropy(logits, torch.from_numpy(expected_y[batch]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            optimizer.step()
    for (name, got), want in zip(
        pooled.state_dict().items(), model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


def test_pooled_reference_scores_each_client_on_its_own_test_split() -> None:
    config = load_config(
        None,
        [
            "rounds=2",
            "train.local_epochs=2",
            "train.batch_size=6",
            "model.name=tiny",
            "model.num_classes=3",
            "model.embed_dim=4",
            "seed=5",
        ],
    )
    reference = pooled_reference(config, SHARDS)
    assert not isinstance(reference, str)
    assert reference.epochs == 4
    assert reference.samples == 36
    x, y = pool_training_data(list(SHARDS.values()))
    model = train_pooled(
        x, y, arch="tiny", num_classes=3, embed_dim=4, train=config.train, epochs=4, seed=5
    )
    assert reference.per_client == score_per_client(model, SHARDS)
    for cid, shard in SHARDS.items():
        predicted = predict_logits(model, shard.x_test).argmax(axis=1)
        assert reference.per_client[cid]["accuracy"] == pytest.approx(
            np.mean(predicted == shard.y_test)
        )
    assert reference.mean["accuracy"] == pytest.approx(
        np.mean([r["accuracy"] for r in reference.per_client.values()])
    )


def test_no_pooled_model_across_input_shapes_or_architectures() -> None:
    mixed = {"0": toy(0, subcarriers=30), "1": toy(1, subcarriers=56)}
    why = pooling_obstacle(mixed, {"0": "tiny", "1": "tiny"})
    assert why is not None
    assert "differ in shape" in why
    assert "(8, 30)" in why
    assert "(8, 56)" in why
    why = pooling_obstacle(SHARDS, {"0": "tiny", "1": "middle", "2": "large"})
    assert why is not None
    assert "different architectures" in why
    assert pooling_obstacle(SHARDS, dict.fromkeys(SHARDS, "tiny")) is None
    config = load_config(None, ['model.per_client=["tiny", "middle", "large"]'])
    assert isinstance(pooled_reference(config, SHARDS), str)


def test_the_table_has_a_pooled_row_or_says_why_it_is_absent() -> None:
    runs = [
        PooledRun("data", 0, Path("."), metrics={"accuracy": 0.9, "f1": 0.8, "mae": 0.1}),
        PooledRun("data", 1, Path("."), metrics={"accuracy": 0.7, "f1": 0.6, "mae": 0.3}),
        PooledRun("model", 0, Path("."), absent="clients run different architectures"),
    ]
    pooled = aggregate_pooled(runs, ["data", "model"])
    assert pooled[0].accuracy is not None
    assert pooled[0].accuracy.mean == pytest.approx(0.8)
    assert pooled[0].runs == 2
    assert pooled[1].runs == 0
    assert pooled[1].absent == "clients run different architectures"
    rows = [
        CompareRow.model_validate(
            {
                "method": "local",
                "setting": s,
                "runs": 1,
                **{k: {"mean": 0.5, "std": 0.0} for k in ("accuracy", "f1", "mae", "kb")},
            }
        )
        for s in ("data", "model")
    ]
    table = markdown_table(rows, ["local"], ["data", "model"], [0, 1], pooled)
    row = next(line for line in table.splitlines() if line.startswith("| pooled"))
    assert "80.00 ± 14.14" in row
    assert row.count("absent") == 3
    assert "pooled is absent in Model Architecture: clients run different architectures" in table
    assert "local: every client trains alone (the lower bound)" in table
    assert "pooled" not in markdown_table(rows, ["local"], ["data"], [0])  # pooled not given


def test_run_pooled_keeps_its_result_and_reuses_it_only_for_the_same_config(
    tmp_path: Path,
) -> None:
    overrides = pooled_overrides(
        ["federation.num_clients=2", "rounds=1", "model.embed_dim=8"], "data", 0
    )
    first = run_pooled("configs/digits-fedsap.toml", overrides, PooledRun("data", 0, tmp_path))
    assert first.absent is None
    assert not first.resumed
    assert set(first.per_client) == {"0", "1"}
    again = run_pooled(
        "configs/digits-fedsap.toml", overrides, PooledRun("data", 0, tmp_path), resume=True
    )
    assert again.resumed
    assert again.metrics == first.metrics
    other = run_pooled(
        "configs/digits-fedsap.toml",
        [*overrides, "train.lr=0.02"],
        PooledRun("data", 0, tmp_path),
        resume=True,
    )
    assert not other.resumed
    assert json.loads((tmp_path / "pooled.json").read_text())["config"]["train"]["lr"] == 0.02
