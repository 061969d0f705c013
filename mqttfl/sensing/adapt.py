"""FedAPA-S on the device: the exported model adapted to its session, without torch.

What the federation computes on a session's windows (``FedAPASessionClient.predict``,
:mod:`mqttfl.algorithms.fedapa.session`), here with numpy and onnxruntime on the graph of
:mod:`mqttfl.export.adaptive`:

0. **The screen** (:class:`~mqttfl.adaptation.screen.WindowScreen`, sensor.json's
   ``adaptation.screen``): windows far from the others' median are left out of steps 1-3,
   at most a minority of them, so a few injected windows cannot drag the estimate; every
   window is still classified with it. The count goes with the estimate (``left_out``).
1. **The layered statistics** (:mod:`mqttfl.training.normstats`'s definition): pass k
   feeds the adapted statistics of layers 0..k-1 (the trained ones after them) and reads
   layer k's per-channel sums, sums of squares and counts, accumulated over bounded
   batches in float64 (:class:`~mqttfl.adaptation.moments.MomentSums`), so the result
   does not depend on the batching. K layers, K passes. Below ``min_adapt_windows``
   windows nothing is estimated: the trained model predicts as it is (its head with the
   trained statistics). A model without BatchNorm has no statistics to adapt (its
   graph takes none): steps 1 and 2 are skipped and it adapts by step 3 alone, as the
   federation does.
2. **The gate** (:class:`~mqttfl.adaptation.shift.ShiftGate`): the fit ratio r of the
   windows' embeddings to Q_i, adapted over trained (two more passes); where r is below
   the calibrated threshold the trained model predicts as it is. The shift score s (the
   first layer's input moments against the training windows', from pass 0) is reported.
3. **The refinement**: cosine k-means from Q_i on the adapted embeddings,
   ``refine_steps`` steps (:func:`~mqttfl.adaptation.refine.refine_prototypes`).
   A window's class is its most similar refined prototype; its confidence the softmax of
   cos/τ over the available classes (FedAPA's L_g, Eq. 9).

**Transductive** (:meth:`Adapter.adapt` on a whole session: ``sense --eval``) this is
the federation's evaluation, number for number. **On the live stream**
(:class:`StreamAdapter`) the windows are those of a bounded rolling buffer: the latest
``buffer`` windows, none older than ``horizon_s`` seconds. The statistics are re-estimated
from the whole buffer, exactly as above (each window in it counts once: cumulative over the
buffer, not an exponential average), every ``every`` windows, and sooner while the buffer is
young (once it has doubled since the last estimate). Why not exponential: the
layered statistics are not a running quantity (a change in layer k's statistics changes
every later layer's input, so moments accumulated before it are stale), and an exact
estimate over the buffer is the federation's own definition: an estimate on a buffer
holding the whole session is the transductive answer. Forgetting is the buffer's bound.
Each reading is predicted with the estimate in force when it arrives: in stream order
(``--eval --stream``) an estimate due at a window is made before that window is scored;
live, it runs in a worker thread and replaces the estimate in force when done.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mqttfl.adaptation.moments import MomentSums
from mqttfl.adaptation.refine import refine_on
from mqttfl.adaptation.shift import fit_ratio, prototype_fit
from mqttfl.sensing.adaptive_spec import AdaptationSpec

#: the score of a class Q_i does not hold (never the argmax; finite, so it is published)
UNAVAILABLE_SCORE = -1e9
#: at most this many windows per onnxruntime call while adapting (the sums do not depend
#: on it), and fewer where a batch's float64 moments of the widest layer would pass
#: ADAPT_BUDGET_BYTES (onnxruntime keeps its peak allocation: it is the sensor's RSS)
ADAPT_BATCH = 64
ADAPT_BUDGET_BYTES = 1 * 2**20
#: stream defaults, chosen by measurement (docs/benchmarks/sensing.md, "The adapting sensor")
DEFAULT_BUFFER = 256
DEFAULT_HORIZON_S = 3600.0
DEFAULT_EVERY = 32

Statistics = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Adaptation:
    """One estimate: whether the model adapts, the gate's score, the statistics it
    normalizes with and the refined prototypes (None: the classifier head)."""

    adapted: bool
    score: float | None  # the shift score; None: no gate, or too few windows
    stats: np.ndarray  # (2, ΣC) float32: the graph's statistics input
    prototypes: np.ndarray | None
    windows: int  # how many windows it was given (left_out of them not estimated on)
    ratio: float | None = None  # the gate's fit ratio (adapted / trained fit to Q_i)
    left_out: int = 0  # windows the screen left out of the estimate

    def figures(self) -> dict[str, Any]:
        """What each reading made with it says (:class:`~mqttfl.sensing.model.Reading`)."""
        return {"adapted": self.adapted, "shift_score": self.score, "fit_ratio": self.ratio}


def stat_matrix(stats: Statistics) -> np.ndarray:
    """(2, ΣC_k) float32, the graph's ``norm_stats``: every layer's means over its variances."""
    if not stats:  # a model without BatchNorm
        return np.zeros((2, 0), np.float32)
    means = np.concatenate([np.asarray(m, np.float64) for m, _ in stats])
    variances = np.concatenate([np.asarray(v, np.float64) for _, v in stats])
    return np.stack([means, variances]).astype(np.float32)


class Adapter:
    """The adaptation of one session's windows (module docstring, steps 1-3), on an
    onnxruntime session of the adaptive graph."""

    def __init__(self, session: object, input_name: str, spec: AdaptationSpec) -> None:
        self.session = session
        self.input_name = input_name
        self.spec = spec
        self.trained = stat_matrix(spec.trained_statistics())
        self.bounds = np.cumsum([0, *spec.channels])
        self.batch: int | None = None  # windows per call, once a window was seen

    def batch_for(self, x: np.ndarray) -> int:
        """Fewer windows per call where one window's layer inputs are large: a batch's
        float64 copy and its squares of the widest layer within ADAPT_BUDGET_BYTES."""
        if not len(x) or not self.spec.normalizes:
            return ADAPT_BATCH
        if self.batch is None:
            counts = self.run([self.spec.counts_output], x[:1], self.trained)[0]
            widest = max(int(c) * k for c, k in zip(counts, self.spec.channels, strict=True))
            self.batch = int(np.clip(ADAPT_BUDGET_BYTES // max(1, 16 * widest), 1, ADAPT_BATCH))
        return self.batch

    def run(self, outputs: list[str], x: np.ndarray, stats: np.ndarray) -> list[np.ndarray]:
        feed = {self.input_name: np.ascontiguousarray(x, dtype=np.float32)}
        if self.spec.normalizes:
            feed[self.spec.statistics_input] = stats
        return list(self.session.run(outputs, feed))  # type: ignore[attr-defined]

    def layer_sums(self, x: np.ndarray, stats: np.ndarray, k: int) -> MomentSums:
        """Layer k's input sums over ``x`` with the graph normalizing by ``stats``."""
        a, b = int(self.bounds[k]), int(self.bounds[k + 1])
        sums = MomentSums(b - a)
        names = [self.spec.moments_output, self.spec.counts_output]
        batch = self.batch_for(x)
        for start in range(0, len(x), batch):
            moments, counts = self.run(names, x[start : start + batch], stats)
            sums.add(round(float(counts[k])), moments[0, a:b], moments[1, a:b])
        return sums

    def layered_statistics(self, x: np.ndarray, first: MomentSums | None = None) -> Statistics:
        """Every layer's adapted (mean, var) over ``x`` (module docstring, step 2)."""
        stats: Statistics = []
        current = self.trained.copy()
        for k in range(len(self.spec.channels)):
            sums = first if k == 0 and first is not None else self.layer_sums(x, current, k)
            mean, var = sums.moments()
            stats.append((mean, var))
            a, b = int(self.bounds[k]), int(self.bounds[k + 1])
            current[0, a:b] = mean.astype(np.float32)
            current[1, a:b] = var.astype(np.float32)
        return stats

    def embeddings(self, x: np.ndarray, stats: np.ndarray) -> np.ndarray:
        batch = self.batch_for(x)
        parts = [
            self.run([self.spec.embedding_output], x[i : i + batch], stats)[0]
            for i in range(0, len(x), batch)
        ]
        return np.concatenate(parts)

    def head_scores(self, x: np.ndarray, stats: np.ndarray, head_output: str) -> np.ndarray:
        """The head's logits of ``x`` normalized by ``stats``, in bounded batches."""
        batch = self.batch_for(x)
        parts = [
            self.run([head_output], x[i : i + batch], stats)[0] for i in range(0, len(x), batch)
        ]
        return np.concatenate(parts)

    def fixed(
        self,
        windows: int,
        score: float | None = None,
        ratio: float | None = None,
        left_out: int = 0,
    ) -> Adaptation:
        return Adaptation(False, score, self.trained, None, windows, ratio, left_out)

    def adapt(self, x: np.ndarray) -> tuple[Adaptation, np.ndarray | None]:
        """The estimate on ``x`` and, where it adapts with prototypes, the refined
        assignment of ``x`` (the federation's prediction), else None."""
        spec = self.spec
        if len(x) < spec.min_adapt_windows:
            return self.fixed(len(x)), None
        keep = np.ones(len(x), bool) if spec.screen is None else spec.screen.kept(x)
        left_out = len(x) - int(keep.sum())
        fit = x[keep] if left_out else x
        stats, first = self.trained, None
        if spec.normalizes:
            first = self.layer_sums(fit, self.trained, 0)
            stats = stat_matrix(self.layered_statistics(fit, first))
        q, available = spec.prototypes, spec.available
        z = score = ratio = None
        gate = None if first is None else spec.gate  # none without BatchNorm
        if gate is not None and first is not None and q is not None and available is not None:
            z = self.embeddings(x, stats)
            score = gate.shift(*first.moments())
            trained = prototype_fit(self.embeddings(fit, self.trained), q, available)
            ratio = fit_ratio(prototype_fit(z[keep], q, available), trained)
            if not gate.adapts(ratio):
                return self.fixed(len(x), score, ratio, left_out), None
        if not spec.uses_prototypes:  # the adapted classifier head
            return Adaptation(True, score, stats, None, len(x), ratio, left_out), None
        assert q is not None
        assert available is not None
        z = self.embeddings(x, stats) if z is None else z
        labels, prototypes = refine_on(z, keep, q.copy(), available, spec.refine_steps)
        return Adaptation(True, score, stats, prototypes, len(x), ratio, left_out), labels

    def scores(self, adaptation: Adaptation, x: np.ndarray, head_output: str) -> np.ndarray:
        """Class scores of ``x`` under ``adaptation``: cos/τ to the refined prototypes
        (unavailable classes: a large negative score), or the head's logits."""
        if adaptation.prototypes is None:
            return self.head_scores(x, adaptation.stats, head_output)
        assert self.spec.available is not None
        z = self.embeddings(x, adaptation.stats).astype(np.float64)
        unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        out: np.ndarray = unit @ adaptation.prototypes.T / self.spec.tau
        out[:, ~self.spec.available] = UNAVAILABLE_SCORE
        return out


class StreamAdapter:
    """The rolling buffer of the live stream and the estimate in force (module docstring).

    The buffer is one preallocated array of ``buffer`` windows written round (the oldest
    slot is overwritten; the statistics and the k-means do not depend on the windows'
    order), with each window's time for the horizon. In order (``--eval --stream``) each
    estimate is made when due, before the window that made it due is scored. Live
    (``background``) it runs in a worker thread on the buffer while readings go on with
    the estimate in force, which it replaces when done: a reading never waits for an
    estimate (onnxruntime releases the GIL). Windows that arrive meanwhile wait in a
    queue of at most ``buffer`` and enter the buffer once it is done, so it is never
    copied and never changes under an estimate."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        buffer: int = DEFAULT_BUFFER,
        horizon_s: float = DEFAULT_HORIZON_S,
        every: int = DEFAULT_EVERY,
        on_estimate: Callable[[Adaptation, float], None] | None = None,
    ) -> None:
        if buffer < 2 or every < 1 or not horizon_s > 0:
            raise ValueError("the buffer holds at least 2 windows, every >= 1, horizon > 0")
        self.adapter = adapter
        self.size = buffer
        self.horizon_s = horizon_s
        self.every = every
        self.on_estimate = on_estimate
        self.ring: np.ndarray | None = None  # (buffer, *window shape), allocated once
        self.times = np.full(buffer, -np.inf)  # -inf: an empty slot
        self.next = 0  # the slot the next window goes to (the oldest)
        self.waiting: deque[tuple[np.ndarray, float]] = deque(maxlen=buffer)
        self.current = adapter.fixed(0)
        self.since = 0  # windows pushed since the last estimate began
        self.estimates = 0
        self.last_estimate_s = 0.0  # seconds the last estimate took
        self.pending: asyncio.Task[None] | None = None  # a live estimate under way
        self.failed: BaseException | None = None  # what a live estimate raised

    def _store(self, x: np.ndarray, time_s: float) -> None:
        if self.ring is None:
            self.ring = np.zeros((self.size, *np.shape(x)), np.float32)
        self.ring[self.next] = x
        self.times[self.next] = time_s
        self.next = (self.next + 1) % self.size

    def held(self) -> int:
        """Windows in the buffer, within the horizon of the newest."""
        newest = self.times.max()
        return int(np.count_nonzero(self.times >= newest - self.horizon_s))

    def windows(self) -> np.ndarray:
        """The buffer's windows within the horizon (a view when every slot counts)."""
        ring = self.ring
        assert ring is not None
        keep = self.times >= self.times.max() - self.horizon_s
        held = int(np.count_nonzero(keep))
        if keep[:held].all():  # the first slots: a view
            return ring[:held]
        out: np.ndarray = ring[keep]
        return out

    def push(self, x: np.ndarray, time_s: float) -> bool:
        """Add a window; True when an estimate is due (then counted as begun)."""
        if self.pending is not None:  # the buffer is being read: the window waits
            self.waiting.append((np.asarray(x, np.float32), time_s))
            return False
        self._store(x, time_s)
        self.since += 1
        size = self.held()
        if size < self.adapter.spec.min_adapt_windows:
            if self.current.adapted:  # the horizon emptied the buffer: back to trained
                self.current = self.adapter.fixed(size)
            return False
        due = self.since >= self.every or 2 * self.since >= size or self.estimates == 0
        if not due:
            return False
        self.since = 0
        self.estimates += 1
        return True

    def _install(self, adaptation: Adaptation, started: float) -> None:
        self.current = adaptation
        self.last_estimate_s = time.perf_counter() - started
        if self.on_estimate is not None:
            self.on_estimate(adaptation, self.last_estimate_s)

    def read(
        self, x: np.ndarray, time_s: float, head_output: str, *, background: bool = False
    ) -> np.ndarray:
        """Push a window and score it with the estimate in force (class scores). An error of
        a live estimate is raised here, at the next window, as it would have been in order."""
        if self.failed is not None:
            raise self.failed
        if self.push(x, time_s):
            if background:
                self.pending = asyncio.get_running_loop().create_task(self._estimate())
            else:
                started = time.perf_counter()
                self._install(self.adapter.adapt(self.windows())[0], started)
        scores: np.ndarray = self.adapter.scores(self.current, x[None], head_output)[0]
        return scores

    async def _estimate(self) -> None:
        started = time.perf_counter()
        try:
            adaptation, _ = await asyncio.to_thread(self.adapter.adapt, self.windows())
        except Exception as exc:  # raised by read(), in the sensing loop
            self.failed = exc
            return
        finally:
            self.pending = None
            while self.waiting:
                self._store(*self.waiting.popleft())
                self.since += 1
        self._install(adaptation, started)

    async def settle(self) -> None:
        """Wait for an estimate under way (at the end of the input)."""
        if self.pending is not None:
            await asyncio.wait({self.pending})
