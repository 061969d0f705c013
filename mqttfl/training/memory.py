"""What a client's passes over its shard may hold at once, and giving memory back.

A device has a few hundred MB (a 512 MB one-core board, say). Training keeps the
method's batch size (a smaller one would change BatchNorm's batch statistics, so the
update); every other pass over a shard (evaluation, prototypes, embeddings) runs in
eval mode, where a sample's output does not depend on the batch it is in, so its batch
is sized to keep the activations under :data:`EVAL_ACTIVATION_BYTES`.

glibc keeps freed heap in its arenas; a round's temporaries (a simulator's arrays, an
evaluation's outputs) would stay in the process's RSS for the rest of its life.
:func:`release` returns them at the end of each phase (as Flower's client app does at
the end of a round, PR #5038).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import TYPE_CHECKING

from mqttfl.training.lazy import no_grad, torch

if TYPE_CHECKING:
    from torch import nn

#: activation bytes one evaluation batch may hold (its largest layer output, twice:
#: a layer's input and output are alive together)
EVAL_ACTIVATION_BYTES = 16 * 2**20
#: the largest evaluation batch (the training batch size's counterpart for every other pass)
MAX_EVAL_BATCH = 256


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release(*, collect: bool = False) -> None:
    """Hand freed heap back to the OS (glibc's ``malloc_trim``; a no-op on a C library
    without it); with ``collect``, collect cyclic garbage first (a full collection costs
    0.2-0.3 s once torch is imported, so not after every round)."""
    if collect:
        gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@no_grad
def largest_activation(model: nn.Module, sample_shape: tuple[int, ...]) -> int:
    """Elements of the largest tensor any submodule takes or outputs for one sample of
    ``sample_shape`` (one forward pass in eval mode on zeros; the mode is restored)."""
    sizes = [0]

    def record(module: nn.Module, inputs: tuple[object, ...], output: object) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        for item in (*inputs, *outputs):
            if isinstance(item, torch.Tensor):
                sizes.append(item.numel())

    was_training = model.training
    hooks = [m.register_forward_hook(record) for m in model.modules()]
    try:
        model.eval()
        model(torch.zeros((1, *sample_shape)))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return max(sizes)


def eval_batch_size(model: nn.Module, sample_shape: tuple[int, ...]) -> int:
    """The evaluation batch for ``model`` on samples of ``sample_shape``: as many samples
    as keep two of its largest activations under :data:`EVAL_ACTIVATION_BYTES`, between 1
    and :data:`MAX_EVAL_BATCH`. Cached on the model per shape (its layers do not change)."""
    shape = tuple(int(n) for n in sample_shape)
    cache: dict[tuple[int, ...], int] = model.__dict__.setdefault("_mqttfl_eval_batch", {})
    if shape not in cache:
        per_sample = 2 * 4 * max(1, largest_activation(model, shape))  # float32
        cache[shape] = max(1, min(MAX_EVAL_BATCH, EVAL_ACTIVATION_BYTES // per_sample))
    return cache[shape]


def resident_mb() -> tuple[float, float]:
    """This process's resident set now and at its peak (``VmRSS``, ``VmHWM``), in MB;
    zeros where /proc is not there."""
    found = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in found:
                    found[key] = int(value.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return round(found["VmRSS"], 1), round(found["VmHWM"], 1)
