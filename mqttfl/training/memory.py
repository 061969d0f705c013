"""What a client's passes over its shard may hold at once, and giving memory back.

A device has a few hundred MB (a 512 MB one-core board, say). Training keeps the
method's batch size (a smaller one would change BatchNorm's batch statistics, so the
update); every other pass over a shard (evaluation, prototypes, embeddings) runs in
eval mode, where a sample's output does not depend on the batch it is in, so its batch
is sized to keep the activations under :data:`EVAL_ACTIVATION_BYTES`.

glibc keeps freed heap in its arenas; a round's temporaries (a simulator's arrays, an
evaluation's outputs) would stay in the process's RSS for the rest of its life.
:func:`release` returns them. A client that works every round would fault the same
pages in again at its next pass, so :class:`IdleRelease` returns them at once only where
memory is short (a board near its limit, a host of many client processes), and
elsewhere once the process has run no pass for a while: a waiting client holds
nothing, a busy one keeps its working set.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable
from pathlib import Path
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


#: glibc's mallopt parameter: how many arenas the process's threads allocate from
_M_ARENA_MAX = -8


def one_arena() -> bool:
    """Make every thread of this process allocate from one glibc arena (``mallopt``'s
    ``M_ARENA_MAX``), before its worker threads start. A fleet's workers take turns over
    hundreds of clients' passes; in an arena each, every arena would keep the high-water
    mark of the passes its thread ever ran. True where the C library took it."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, 1))


#: how long a process must have run no pass (training, scoring) before its freed heap
#: goes back to the OS: longer than a round's gaps between one client's passes (its
#: upload to the downlink, its scoring to the next start), far shorter than a wait of an
#: unselected client
IDLE_RELEASE_S = 2.0
#: the share of memory in use (the host's, or its cgroup's under a limit) from which a
#: pass's freed heap goes back at once: memory, not the cores, is then what runs short
PRESSED_SHARE = 0.5


def memory_in_use(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> float:
    """The share of memory in use: the larger of the host's (``1 - MemAvailable /
    MemTotal``) and, where this process's memory cgroup has a limit, the cgroup's
    (usage over limit; cgroup v1 or v2). 0.0 where neither can be read."""
    shares = [0.0]
    try:
        info = {}
        for line in (proc / "meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info[key] = int(value.split()[0])
        shares.append(1.0 - info["MemAvailable"] / info["MemTotal"])
    except (OSError, ValueError, IndexError, KeyError, ZeroDivisionError):
        pass
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "memory":  # v1
                group = cgroups / "memory" / path.lstrip("/")
                files = ("memory.usage_in_bytes", "memory.limit_in_bytes")
            elif controllers == "":  # v2
                group = cgroups / path.lstrip("/")
                files = ("memory.current", "memory.max")
            else:
                continue
            usage, limit = ((group / name).read_text().strip() for name in files)
            if limit.isdigit() and 0 < int(limit) < 2**60:  # "max" or near 2**63: no limit
                shares.append(int(usage) / int(limit))
    except (OSError, ValueError):
        pass
    return max(shares)


class IdleRelease:
    """:func:`release` once no pass has run for :attr:`after_s` seconds, or as the last
    pass ends where :attr:`in_use` says :data:`PRESSED_SHARE` of memory is taken.

    Passes :meth:`begin` and :meth:`end` on the event loop; the runners of a fleet share
    one (:data:`IDLE`), so one runner's release never pulls pages from under another's
    training.
    """

    def __init__(
        self, after_s: float = IDLE_RELEASE_S, in_use: Callable[[], float] = memory_in_use
    ) -> None:
        self.after_s = after_s
        self.in_use = in_use
        self.running = 0
        self.releases = 0
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        self.running += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def end(self) -> None:
        self.running = max(0, self.running - 1)
        if self.running > 0:
            return
        if self.in_use() >= PRESSED_SHARE:
            self._release()
        else:
            self._timer = asyncio.get_running_loop().call_later(self.after_s, self._release)

    def _release(self) -> None:
        self._timer = None
        if self.running == 0:
            release()
            self.releases += 1


#: the process's one idle release, shared by every runner in it
IDLE = IdleRelease()


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
