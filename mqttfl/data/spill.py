"""A shard's windows in a file, mapped, so that a client which waits holds none of them.

A fleet holds hundreds of clients in one process, and in a round most of them train
nothing. Their windows are most of what they hold (100 CSI windows of 64 x 242 are
6.2 MB, the model 1.9 MB). :func:`spill` writes a shard's window arrays to a file and
maps them back, copy-on-write, so the arrays read as before; :func:`release` hands their
pages back to the kernel after each pass, and the next pass faults them in again from
the page cache (a minor fault a page), or from disk where the kernel had to evict them.

The file has no name: it is opened unnamed in the given folder (``O_TMPFILE``) and lives
exactly as long as its mapping, so a process killed at any moment leaves nothing behind,
and nobody else can open or replace it. The folder should be on disk, not a tmpfs, or
the windows stay in memory, only no longer counted as the process's.
"""

from __future__ import annotations

import dataclasses
import mmap
import tempfile
from pathlib import Path

import numpy as np

from mqttfl.data.shard import Shard

#: the arrays of a shard that are spilled (the labels and session ids are small)
SPILLED = ("x_train", "x_test")


def spill(shard: Shard, directory: Path) -> Shard:
    """The same shard with its windows in an unnamed file in ``directory``, mapped, and
    none of their pages resident yet."""
    spilled = dataclasses.replace(
        shard,
        x_train=_mapped(shard.x_train, directory),
        x_test=_mapped(shard.x_test, directory),
    )
    release(spilled)
    return spilled


def _mapped(array: np.ndarray, directory: Path) -> np.ndarray:
    if not array.nbytes:
        return array
    with tempfile.TemporaryFile(dir=directory) as handle:
        handle.write(np.ascontiguousarray(array).data)  # from its buffer, no copy
        handle.flush()
        # private: writable for torch.from_numpy, and nothing written ever reaches the file
        mapping = mmap.mmap(
            handle.fileno(),
            array.nbytes,
            flags=mmap.MAP_PRIVATE,
            prot=mmap.PROT_READ | mmap.PROT_WRITE,
        )
    return np.frombuffer(mapping, dtype=array.dtype).reshape(array.shape)


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The mapping under ``array`` (None: an array in memory)."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def release(shard: Shard) -> None:
    """Drop the resident pages of a spilled shard's windows (nothing for one in memory)."""
    for key in SPILLED:
        mapping = _mapping(getattr(shard, key))
        if mapping is not None:
            mapping.madvise(mmap.MADV_DONTNEED)


def is_spilled(shard: Shard) -> bool:
    return any(_mapping(getattr(shard, key)) is not None for key in SPILLED)
