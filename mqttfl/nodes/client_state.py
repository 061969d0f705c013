"""A client's state file: model, optimizer, method state and progress, for restarts.

A state belongs to one run. The file sits under the run's id
(``<state-dir>/<run-id>/client-<id>.pt``), so one device can take part in two runs, one
after the other or at once, each with its own state; and it records its :class:`Owner`
(run id, method, model architecture and a digest of the config that decides training).
A state whose owner is not this run's, or that cannot be read or loaded, is set aside
(renamed ``*.discarded``) with one ``state.discarded`` log line, and the client starts
fresh: it never crashes on an old file and never skips a round that it has not trained.
A state also records the run *instance* it trained for (the coordinator's id for one run
of a run id, :mod:`mqttfl.nodes.client_rounds`): a state resumed from another instance of
the same run id (the run id started again) is set aside the same way once the run says
which instance it is, before the client acknowledges anything.
A reader of a finished run (``mqttfl export``) loads it with
:meth:`StateFile.load_read_only` instead: the file stays as it is, and what cannot be
used is one DataError.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import io
import json
import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

import numpy as np
import torch

from mqttfl.errors import DataError
from mqttfl.files import one_line, write_atomic
from mqttfl.logs import get_logger

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger as BoundLogger

    from mqttfl.algorithms.base import ClientSide
    from mqttfl.config import RunConfig
    from mqttfl.training.optimizers import OptimizerState
    from mqttfl.wire.schemas import ClientInfo


class Snapshot(TypedDict):
    """What a state file holds (:meth:`StateFile.snapshot`, and the owner as it is
    written). A file read back is only known to be a dict: :meth:`StateFile.restore`
    raises on what does not fit, and its callers take that as a state that does not load."""

    model: dict[str, torch.Tensor]
    optimizer: OptimizerState
    method: dict[str, torch.Tensor]
    trained_round: int
    applied_round: int
    uploads: int
    instance: str
    owner: NotRequired[dict[str, object]]


@dataclass
class Progress:
    """How far a client got: the rounds it trained and applied, its bytes sent per round."""

    trained_round: int = 0
    applied_round: int = 0
    bytes_up: dict[int, int] = field(default_factory=dict)
    uploads: int = 0  # uploads charged to the privacy budget (mqttfl/nodes/client_privacy.py)
    instance: str = ""  # the run instance trained for ("": none seen yet)


@dataclass(frozen=True)
class Owner:
    """Whose state a file holds: a state is resumed only by the run that wrote it."""

    run_id: str
    method: str
    arch: str
    config: str  # digest of what decides training (see training_digest)

    @classmethod
    def of(cls, config: RunConfig, info: ClientInfo) -> Owner:
        return cls(config.run_id, config.method, info.arch, training_digest(config, info))

    def mismatch(self, saved: object) -> str | None:
        """Why a file's recorded owner is not this one (None when it is)."""
        if not isinstance(saved, dict):
            return "the file records no run, method, model or config (an older format)"
        for key, mine in asdict(self).items():
            theirs = saved.get(key)
            if theirs != mine:
                what = "training config digest" if key == "config" else key.replace("_", " ")
                return f"{what} {str(theirs)[:80]!r} is not this run's {mine!r}"
        return None


def training_digest(config: RunConfig, info: ClientInfo) -> str:
    """SHA-256 (16 hex digits) of everything that decides what a client trains: method
    and its table, model, local training (not its thread count), data, seed, rounds and
    the federation's size (shards are cut for it), and the shard the client holds."""
    decides = {
        "method": config.method,
        "method_params": config.method_params,
        "model": config.model.model_dump(mode="json"),
        "train": config.train.model_dump(mode="json", exclude={"torch_threads"}),
        "data": config.data.model_dump(mode="json"),
        "seed": config.seed,
        "rounds": config.rounds,
        "num_clients": config.federation.num_clients,
        "shard": [list(info.classes), info.num_samples, list(info.sample_shape)],
    }
    text = json.dumps(decides, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_path(state_dir: Path, run_id: str, client_id: str) -> Path:
    """Where a client keeps its state of one run."""
    return state_dir / run_id / f"client-{client_id}.pt"


class StateFile:
    """Snapshots are taken between training steps and written in the background, one
    write at a time, so serializing the model is not on the round's critical path."""

    def __init__(
        self, path: Path, owner: Owner | None = None, *, log: BoundLogger | None = None
    ) -> None:
        self.path = path
        self.owner = owner
        self.log = log if log is not None else get_logger()
        self._writing: asyncio.Task[None] | None = None
        # Builds the state to start afresh from (a fresh model): set by its owner before
        # load(). Built when needed, not kept: a waiting client holds one model, not two.
        self.fresh: Callable[[], Snapshot] | None = None

    def read(self) -> Snapshot:
        """The file's state, never changing the file; DataError naming it and what is
        wrong if it cannot be read (cut short, not a state file)."""
        try:
            with warnings.catch_warnings():  # torch's remarks on a foreign pickle
                warnings.simplefilter("ignore")
                state = torch.load(self.path, weights_only=True)
        except FileNotFoundError:
            raise DataError(self.path, "client state file not found") from None
        except Exception as exc:  # truncated, or not a state file at all
            first = one_line(exc).split(". ")[0]  # torch's advice follows
            raise DataError(
                self.path,
                f"unreadable (cut short, or not a state file): {type(exc).__name__}: {first}",
            ) from None
        if not isinstance(state, dict):
            raise DataError(self.path, "unreadable: not a state file")
        return cast("Snapshot", state)

    def load(self, model: torch.nn.Module, method: ClientSide, progress: Progress) -> bool:
        """Resume from the file if it is this run's; set it aside (and start fresh) if not."""
        if not self.path.exists():
            return False
        try:
            state = self.read()
        except DataError as exc:
            self._discard(str(exc).removeprefix(f"{self.path}: "))
            return False
        if self.owner is not None:
            reason = self.owner.mismatch(state.get("owner"))
            if reason is not None:
                self._discard(reason)
                return False
        fresh = self.fresh
        if fresh is None:  # without an owner's builder, the model as it is now is fresh
            kept = self.snapshot(model, method, progress)
            fresh = lambda: kept  # noqa: E731
        try:
            self.restore(state, model, method, progress)
        except Exception as exc:  # e.g. a size mismatch: put the fresh state back
            self.restore(fresh(), model, method, progress)
            self._discard(f"does not load: {type(exc).__name__}: {exc}"[:300])
            return False
        return True

    async def start_afresh(
        self, model: torch.nn.Module, method: ClientSide, progress: Progress, reason: str
    ) -> None:
        """The state is not this run's after all (another instance of its run id): set the
        file aside and put back the fresh state (:attr:`fresh`)."""
        assert self.fresh is not None, "the owner builds a fresh state to start afresh from"
        await self.written()
        if self.path.exists():
            self._discard(reason)
        self.restore(self.fresh(), model, method, progress)

    def load_read_only(
        self,
        model: torch.nn.Module,
        method: ClientSide,
        progress: Progress,
        *,
        state: Snapshot | None = None,
    ) -> None:
        """Load the file (or its ``state`` as :meth:`read` gave it) for a reader such as
        ``mqttfl export``: the file is never renamed or changed, and what cannot be used
        is a DataError naming it, not a fresh start."""
        state = self.read() if state is None else state
        if self.owner is not None:
            reason = self.owner.mismatch(state.get("owner"))
            if reason is not None:
                raise DataError(self.path, f"belongs to another run: {reason}")
        try:
            self.restore(state, model, method, progress)
        except Exception as exc:
            raise DataError(
                self.path,
                f"does not load into the run's model: {type(exc).__name__}: {one_line(exc)}",
            ) from None

    def _discard(self, reason: str) -> None:
        aside = self.path.with_name(self.path.name + ".discarded")
        os.replace(self.path, aside)
        self.log.warning("state.discarded", path=str(self.path), kept_as=aside.name, reason=reason)

    @staticmethod
    def restore(
        state: Snapshot, model: torch.nn.Module, method: ClientSide, progress: Progress
    ) -> None:
        """Put back what :meth:`snapshot` took (or a state file held)."""
        model.load_state_dict(state["model"])
        method.optimizer.load_state_dict(state["optimizer"])
        method.load_state_dict({k: v.numpy() for k, v in state["method"].items()})
        progress.trained_round = int(state["trained_round"])
        progress.applied_round = int(state["applied_round"])
        progress.uploads = int(state.get("uploads", 0))
        progress.instance = str(state.get("instance", ""))

    @staticmethod
    def snapshot(model: torch.nn.Module, method: ClientSide, progress: Progress) -> Snapshot:
        return {
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(method.optimizer.state_dict()),
            "method": {
                k: torch.from_numpy(np.array(v, copy=True)) for k, v in method.state_dict().items()
            },
            "trained_round": progress.trained_round,
            "applied_round": progress.applied_round,
            "uploads": progress.uploads,
            "instance": progress.instance,
        }

    def _write(self, snapshot: Snapshot) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.owner is not None:
            snapshot = {**snapshot, "owner": asdict(self.owner)}
        data = io.BytesIO()
        torch.save(snapshot, data)
        with data.getbuffer() as written:  # not a second copy
            write_atomic(self.path, written, sync=False)  # never through a planted link

    async def save(self, model: torch.nn.Module, method: ClientSide, progress: Progress) -> None:
        """Snapshot now, write in the background (each write waits for the one before).

        A process holds at most ``WRITES_IN_FLIGHT`` snapshots: at a run's last round every
        runner of a fleet saves at once, and each snapshot is a copy of a model and its
        optimizer. The caller waits for a slot before the snapshot is taken, so what is
        written is the state at the moment it returns."""
        await self.written()
        slots = _write_slots()
        await slots.acquire()
        try:
            snapshot = self.snapshot(model, method, progress)
        except BaseException:
            slots.release()
            raise
        self._writing = asyncio.create_task(asyncio.to_thread(self._write, snapshot))
        self._writing.add_done_callback(lambda _: slots.release())

    async def written(self) -> None:
        if self._writing is not None:
            await self._writing
            self._writing = None


WRITES_IN_FLIGHT = 4
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _write_slots() -> asyncio.Semaphore:
    """This event loop's bound on the state snapshots held at once (one per loop: a
    semaphore belongs to the loop it first waits in)."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(WRITES_IN_FLIGHT)
    return slots
