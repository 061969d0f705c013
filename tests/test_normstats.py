"""AdaBN in one walk (mqttfl/training/normstats.py): the statistics and embeddings of the
layer-by-layer passes, with each layer of the encoder run once where its input fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mqttfl.models.base import EmbeddingModel
from mqttfl.models.convnet4 import LargeConvNet4, MiddleConvNet4, TinyConvNet4
from mqttfl.training import normstats
from mqttfl.training.loops import embed_all

WINDOWS = 23  # not a multiple of the batch: a short last batch
BATCH = 5


def _trained(model: EmbeddingModel, subcarriers: int) -> EmbeddingModel:
    """A model whose running statistics are not the initial ones."""
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 16, subcarriers))
    return model.eval()


def _windows(subcarriers: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (rng.normal(size=(WINDOWS, 16, subcarriers)) * 3 + 2).astype(np.float32)


def _separately(model: EmbeddingModel, x: np.ndarray) -> tuple[normstats.Statistics, np.ndarray]:
    stats = normstats.adapted_statistics(model, x, BATCH)
    return stats, embed_all(normstats.with_statistics(model, stats), x, BATCH)


@pytest.mark.parametrize("held", [normstats.HELD_BYTES, 0, 40_000])
@pytest.mark.parametrize("kind", [TinyConvNet4, MiddleConvNet4, LargeConvNet4])
def test_one_walk_gives_the_statistics_and_embeddings_of_the_separate_passes(
    kind: type[EmbeddingModel], held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit, whether every layer's input is kept (the default), none is (0: each
    layer's input computed again from the windows) or some are (40 kB)."""
    monkeypatch.setattr(normstats, "HELD_BYTES", held)
    model = _trained(kind(num_classes=5, embed_dim=32), 24)
    x = _windows(24)
    before = normstats.trained_statistics(model)
    stats, expected_z = _separately(model, x)
    walked, adapted, z = normstats.adapted_embeddings(model, x, BATCH)
    assert len(walked) == len(stats) == len(normstats.norm_layers(model))
    for (mean, var), (walked_mean, walked_var) in zip(stats, walked, strict=True):
        np.testing.assert_array_equal(walked_mean, mean)
        np.testing.assert_array_equal(walked_var, var)
    np.testing.assert_array_equal(z, expected_z)
    np.testing.assert_array_equal(embed_all(adapted, x, BATCH), expected_z)
    assert not adapted.training
    held_stats = normstats.trained_statistics(adapted)  # what the adapted copy holds
    for (mean, var), (held_mean, held_var) in zip(stats, held_stats, strict=True):
        np.testing.assert_allclose(held_mean, mean, rtol=1e-6)
        np.testing.assert_allclose(held_var, var, rtol=1e-6)
    # the model it was given keeps its own statistics
    after = normstats.trained_statistics(model)
    for (mean, var), (kept_mean, kept_var) in zip(before, after, strict=True):
        np.testing.assert_array_equal(kept_mean, mean)
        np.testing.assert_array_equal(kept_var, var)
    assert not np.allclose(before[0][0], stats[0][0])


def _count_convolutions(model: nn.Module) -> list[int]:
    """Runs of each of the model's convolutions, in its copies too (deepcopy keeps the
    index set here), counted from now on."""
    convolutions = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    for i, conv in enumerate(convolutions):
        conv.counted_as = i  # type: ignore[assignment]
    return [0] * len(convolutions)


def test_each_convolution_runs_once_a_batch_where_every_input_fits() -> None:
    """The walk's point: five BatchNorm layers and the embedding cost one pass through
    the encoder, where the separate passes run the first convolution six times."""
    model = _trained(LargeConvNet4(num_classes=5, embed_dim=32), 24)
    x = _windows(24)
    batches = -(-WINDOWS // BATCH)
    counts = _count_convolutions(model)

    def count(module: nn.Module, _: object) -> None:
        index = getattr(module, "counted_as", None)
        if isinstance(index, int):
            counts[index] += 1

    handle = nn.modules.module.register_module_forward_pre_hook(count)
    try:
        normstats.adapted_embeddings(model, x, BATCH)
        walked = list(counts)
        counts[:] = [0] * len(counts)
        _separately(model, x)
        separate = list(counts)
    finally:
        handle.remove()
    assert walked == [batches] * 6  # five blocks and the 1x1 head, once a batch
    assert separate[0] == 6 * batches  # once per BatchNorm layer, and once to embed
    assert separate[-1] == batches  # the head: only to embed


class _NoStages(EmbeddingModel):
    """A BatchNorm model that does not write its encoder in stages."""

    def __init__(self) -> None:
        super().__init__(embed_dim=3, num_classes=2)
        self.norm = nn.BatchNorm1d(3)
        self.classifier = nn.Linear(3, 2)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        normalized: torch.Tensor = self.norm(torch.flatten(x, 1)[:, :3])
        return normalized


def test_a_model_without_stages_gets_the_separate_passes() -> None:
    model = _NoStages().eval()
    x = np.random.default_rng(2).normal(size=(WINDOWS, 4)).astype(np.float32) + 5
    stats, expected_z = _separately(model, x)
    walked, _, z = normstats.adapted_embeddings(model, x, BATCH)
    np.testing.assert_array_equal(walked[0][0], stats[0][0])
    np.testing.assert_array_equal(z, expected_z)
    # by hand: the embedding is the windows' first three features standardized
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-5)
