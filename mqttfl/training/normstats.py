"""BatchNorm statistics re-estimated on a set of windows, exactly and in bounded memory.

The adapted statistics of a set X (AdaBN: Li et al., "Revisiting Batch Normalization For
Practical Domain Adaptation", ICLR-W 2017), as FedAPA-S and the deployed sensor compute
them: for each BatchNorm layer k in forward order, the per-channel mean and unbiased
variance of layer k's input over all of X, where the layers before k already normalize
with their adapted statistics. Each layer takes one pass over X in bounded batches,
accumulating each channel's count, sum and sum of squares in float64
(:class:`~mqttfl.adaptation.moments.MomentSums`), so the result is the same however X is
batched, and a layer's pass stops at that layer. Every weight, and the affine γ and β, is
kept. The sensor repeats the same passes with onnxruntime (:mod:`mqttfl.sensing.adapt`).

:func:`adapted_embeddings` gives the same statistics and the windows' embeddings under
them in one walk through an encoder written in stages: layer k's input is computed from
layer k-1's input, kept for every window while it fits :data:`HELD_BYTES`, rather than
again from the windows; the operations and batches are those of the separate passes.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING

import numpy as np

from mqttfl.adaptation.moments import MomentSums
from mqttfl.errors import MqttflError
from mqttfl.training.lazy import nn, no_grad, torch
from mqttfl.training.loops import embed_all

if TYPE_CHECKING:
    from mqttfl.models import EmbeddingModel

Statistics = list[tuple[np.ndarray, np.ndarray]]
#: windows of a batch whose layer input is summed at once (in float64)
MOMENT_WINDOWS = 4
#: a layer's input over every window is kept, to go on from, only within this many bytes:
#: what the walk holds beyond the separate passes (a board's memory: tests/test_board.py's
#: FedAPA-S client on LargeConvNet4 peaked 7-10 MB above them with 12 MB, 15-23 MB with
#: 16); past it the next layer's input is computed again from the last one kept
HELD_BYTES = 12 * 2**20


class _Reached(MqttflError):
    """Stops a forward pass once the layer being measured has seen its input (control
    flow, caught where it is raised; an MqttflError like every exception class here)."""


def norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers in forward order (the models are sequential)."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _running(layer: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.running_mean is None or layer.running_var is None:
        raise ValueError("a BatchNorm layer without running statistics (track_running_stats)")
    return layer.running_mean, layer.running_var


def trained_statistics(model: nn.Module) -> Statistics:
    """Each BatchNorm layer's running (mean, var) as float64 arrays."""
    return [
        (
            layer.running_mean.detach().double().numpy().copy(),
            layer.running_var.detach().double().numpy().copy(),
        )
        for layer in norm_layers(model)
        if layer.running_mean is not None and layer.running_var is not None
    ]


@no_grad
def layer_input_sums(
    model: EmbeddingModel, x: np.ndarray, batch_size: int, layer_index: int = 0
) -> MomentSums:
    """Channel sums of the input of BatchNorm layer ``layer_index`` over ``x``, the model
    in eval mode (the layers before it normalize with the statistics they hold)."""
    layer = norm_layers(model)[layer_index]
    sums = MomentSums(layer.num_features)

    def hook(_: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        _add_windows(sums, inputs[0].detach())
        raise _Reached

    was_training = model.training
    model.eval()
    handle = layer.register_forward_pre_hook(hook)
    try:
        for start in range(0, len(x), max(1, batch_size)):
            with contextlib.suppress(_Reached):
                model.embed(torch.from_numpy(np.ascontiguousarray(x[start : start + batch_size])))
    finally:
        handle.remove()
        model.train(was_training)
    return sums


@no_grad
def set_statistics(model: nn.Module, stats: Statistics) -> None:
    """Write (mean, var) into each BatchNorm layer's running statistics, in place."""
    layers = norm_layers(model)
    if len(layers) != len(stats):
        raise ValueError(f"{len(stats)} statistics for {len(layers)} normalization layers")
    for layer, (mean, var) in zip(layers, stats, strict=True):
        _running(layer)[0].copy_(torch.from_numpy(np.asarray(mean, np.float64)))
        _running(layer)[1].copy_(torch.from_numpy(np.asarray(var, np.float64)))


def adapted_statistics(model: EmbeddingModel, x: np.ndarray, batch_size: int) -> Statistics:
    """The adapted (mean, var) of every BatchNorm layer on ``x`` (module docstring)."""
    work = copy.deepcopy(model)
    stats: Statistics = []
    for k in range(len(norm_layers(work))):
        mean, var = layer_input_sums(work, x, batch_size, k).moments()
        stats.append((mean, var))
        with torch.no_grad():
            running_mean, running_var = _running(norm_layers(work)[k])
            running_mean.copy_(torch.from_numpy(mean))
            running_var.copy_(torch.from_numpy(var))
    return stats


def _add_windows(sums: MomentSums, values: torch.Tensor) -> None:
    # a few windows at a time in float64: a copy of the batch's activations is the
    # largest allocation of an adapting client on a small board
    for start in range(0, len(values), MOMENT_WINDOWS):
        sums.add_values(values[start : start + MOMENT_WINDOWS].double().numpy())


@no_grad
def adapted_embeddings(
    model: EmbeddingModel, x: np.ndarray, batch_size: int
) -> tuple[Statistics, EmbeddingModel, np.ndarray]:
    """:func:`adapted_statistics` of ``x``, the model normalizing with them
    (:func:`with_statistics`) and its embeddings of ``x`` in batches of ``batch_size``, in
    one walk where the encoder is written in stages (module docstring); else in the
    separate passes."""
    work = copy.deepcopy(model).eval()
    stages = work.encoder_stages()
    layers = norm_layers(work)
    cuts = [] if stages is None else [i for i, m in enumerate(stages.body) if m in layers]
    if stages is None or len(cuts) != len(layers):
        separate = adapted_statistics(model, x, batch_size)
        adapted = with_statistics(model, separate)
        return separate, adapted, embed_all(adapted, x, batch_size)
    step = max(1, batch_size)
    # the last layer input kept for every window, and where in the body it stands
    held: list[torch.Tensor] = [
        stages.prepare(torch.from_numpy(np.ascontiguousarray(x[start : start + step])))
        for start in range(0, len(x), step)
    ]
    position = 0
    stats: Statistics = []
    for layer, cut in zip(layers, cuts, strict=True):
        segment = stages.body[position:cut]
        sums = MomentSums(layer.num_features)
        keep: bool | None = None  # whether this layer's input, over every window, fits
        for i, batch in enumerate(held):
            values = segment(batch)
            _add_windows(sums, values)
            if keep is None:  # the batches are of one size (the last may be shorter)
                keep = values.nbytes * len(x) <= HELD_BYTES * len(batch)
            if keep:
                held[i] = values  # in its place: the layer input before is not needed again
        mean, var = sums.moments()
        stats.append((mean, var))
        running_mean, running_var = _running(layer)
        running_mean.copy_(torch.from_numpy(mean))
        running_var.copy_(torch.from_numpy(var))
        if keep:
            position = cut
    tail = stages.body[position:]
    parts = [stages.finish(tail(batch)) for batch in held]
    z = torch.cat(parts).numpy() if parts else np.zeros((0, work.embed_dim), np.float32)
    return stats, work, z


def with_statistics(model: EmbeddingModel, stats: Statistics) -> EmbeddingModel:
    """A copy of ``model`` normalizing with ``stats``, in eval mode."""
    adapted = copy.deepcopy(model)
    set_statistics(adapted, stats)
    return adapted.eval()
