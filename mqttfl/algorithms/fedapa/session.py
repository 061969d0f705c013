"""FedAPA-S: FedAPA's protocol, adapted at test time to the recording session a sensor sees.

Training is FedAPA's without L_c (Eq. 10): the client adds λ_t·L_g (Eqs. 5-9, 11, 12)
toward its personalized prototypes Q_i, so the downlink is Q_i alone (L_c pulls toward
every client's own-session prototypes, the wrong targets on a new day; docs/sessions.md).

At test time (:meth:`FedAPASessionClient.predict`), on the unlabeled windows ``x`` of the
session being classified:

- :func:`renormalize`: BatchNorm's statistics are re-estimated on ``x``, on a copy of the
  trained model (AdaBN: Li et al., "Revisiting Batch Normalization For Practical Domain
  Adaptation", ICLR-W 2017; :mod:`mqttfl.training.normstats`);
- :func:`~mqttfl.adaptation.refine.refine_prototypes`: cosine k-means over the adapted
  embeddings, started at Q_i so clusters keep their class names; the prediction is the
  final assignment (``refine_steps = 0``: nearest Q_i; ``inference = "head"``: the
  adapted head).

The shift gate (:mod:`mqttfl.adaptation.shift`) adapts only where the fit ratio (mean
cosine to the nearest Q_i, adapted over trained) reaches the lowest ratio seen on the
client's own training sessions (leave-one-session-out); below it the trained model
predicts as it is. ``gate = false`` adapts every session. Outlying windows are left out
of the estimate (:mod:`mqttfl.adaptation.screen`, at most ``screen_fraction``), though
every window is classified. The gate's figures go out with the client's metrics
(``adapted``, ``shift_score``, ``fit_ratio``, ``fit_threshold``).

Nothing of the test session crosses the wire and no label of it is read. Under
``min_adapt_windows`` windows the statistics stay as trained; a model without BatchNorm
adapts by the k-means alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from mqttfl.adaptation.refine import MAX_REFINE_STEPS, refine_on
from mqttfl.adaptation.screen import (
    DEFAULT_FRACTION,
    DEFAULT_LIMIT,
    MAX_MIN_ADAPT_WINDOWS,
    WindowScreen,
    feature_scale,
)
from mqttfl.adaptation.shift import ShiftGate, calibrate, fit_ratio, prototype_fit
from mqttfl.algorithms.base import Algorithm
from mqttfl.algorithms.fedapa.client import FedAPAClient
from mqttfl.algorithms.fedapa.params import FedAPAParams
from mqttfl.algorithms.fedapa.server import FedAPAServer
from mqttfl.data.shard import Shard
from mqttfl.training.lazy import torch
from mqttfl.training.loops import embed_all, predict_logits
from mqttfl.training.memory import eval_batch_size
from mqttfl.training.normstats import (
    adapted_embeddings,
    adapted_statistics,
    layer_input_sums,
    norm_layers,
    with_statistics,
)

if TYPE_CHECKING:
    from mqttfl.models import EmbeddingModel


class FedAPASessionParams(FedAPAParams):
    """FedAPA's parameters (τ, λ, T_warm) without L_c by default, and the test time's."""

    use_client_prototypes: bool = False
    #: re-estimate BatchNorm statistics on the windows being classified (AdaBN)
    adapt_norm: bool = True
    #: "prototypes": cosine k-means from Q_i on the adapted embeddings, ``refine_steps``
    #: steps (0: the nearest Q_i); "head": the (adapted) classifier head
    inference: Literal["prototypes", "head"] = "prototypes"
    refine_steps: int = Field(5, ge=0, le=MAX_REFINE_STEPS)
    min_adapt_windows: int = Field(8, ge=2, le=MAX_MIN_ADAPT_WINDOWS)
    #: adapt only where the shift gate finds the session shifted (False: always adapt)
    gate: bool = True
    #: leave at most this fraction of the windows out of the estimate, those farther than
    #: ``screen_limit`` from the others (:mod:`mqttfl.adaptation.screen`; 0: all count)
    screen_fraction: float = Field(DEFAULT_FRACTION, ge=0.0, lt=0.5)
    screen_limit: float = Field(DEFAULT_LIMIT, ge=1.0, le=1000.0)


def renormalize(
    model: EmbeddingModel, x: np.ndarray, batch_size: int | None = None
) -> EmbeddingModel:
    """A copy of ``model`` normalizing with the adapted statistics of ``x``
    (:func:`~mqttfl.training.normstats.adapted_statistics`, AdaBN); every weight, and the
    affine γ, β, is kept."""
    batch = batch_size or eval_batch_size(model, x.shape[1:])
    return with_statistics(model, adapted_statistics(model, x, batch))


def session_fits(
    model: EmbeddingModel, x: np.ndarray, q: np.ndarray, available: np.ndarray
) -> tuple[float, float]:
    """(fit to Q_i under the trained statistics, fit under those re-estimated on ``x``)."""
    trained = prototype_fit(embed_all(model, x), q, available)
    _, _, adapted_z = adapted_embeddings(model, x, eval_batch_size(model, x.shape[1:]))
    return trained, prototype_fit(adapted_z, q, available)


def shift_gate(
    model: EmbeddingModel, shard: Shard, q: np.ndarray, available: np.ndarray
) -> ShiftGate | None:
    """The client's gate, calibrated on its training sessions
    (:func:`~mqttfl.adaptation.shift.calibrate`); None for a model without BatchNorm."""
    if not norm_layers(model):
        return None
    batch = eval_batch_size(model, shard.x_train.shape[1:])
    moments = layer_input_sums(model, shard.x_train, batch, 0).moments()
    return calibrate(
        lambda x: session_fits(model, x, q, available), moments, shard.x_train, shard.s_train
    )


@dataclass(frozen=True)
class GateDecision:
    adapted: bool
    shift: float | None  # None: no gate (a model without BatchNorm, ``gate = false``, no Q_i)
    ratio: float | None  # the fit ratio r to Q_i
    threshold: float | None


@dataclass
class _Passes:
    """What deciding on the kept windows computed: the model adapted to them and their
    embeddings under the trained and the adapted statistics (None: not computed)."""

    adapted: EmbeddingModel | None = None
    trained_z: np.ndarray | None = None
    adapted_z: np.ndarray | None = None


def _labels(model: EmbeddingModel, z: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """The classifier head's labels of ``x``, from its embeddings ``z`` where they are
    given (no second pass through the encoder)."""
    if z is None:
        return np.asarray(predict_logits(model, x).argmax(axis=1))
    model.eval()
    with torch.no_grad():
        return np.asarray(model.classify(torch.from_numpy(z)).argmax(dim=1).numpy())


def _kept_windows(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The windows ``keep`` selects: ``x`` itself where it selects all (no copy)."""
    return x if bool(keep.all()) else x[keep]


class FedAPASessionClient(FedAPAClient):
    """FedAPA's client (L_ce + λ_t L_g, with L_c only if asked) that classifies a session
    after adapting to it (module docstring)."""

    last_decision: GateDecision | None = None
    last_left_out = 0  # windows the screen left out of the last prediction's estimate
    #: the windows of the last prediction and the trained head's labels of them, which
    #: extra_metrics reports beside the adapted prediction without another pass
    _trained_head: tuple[np.ndarray | None, np.ndarray | None] = (None, None)

    def shift_gate(self) -> ShiftGate | None:
        """The gate calibrated on this client's training sessions (module docstring); None
        before any Q_i has arrived or for a model without BatchNorm."""
        if self.q is None or self.available is None:
            return None
        available = self.available.numpy().astype(bool)
        return shift_gate(self.model, self.shard, self.q.numpy(), available)

    def window_screen(self) -> WindowScreen | None:
        """What leaves far windows out of the estimate (None: every window counts), its
        floor scaled by the training windows' spread."""
        p: FedAPASessionParams = self.ctx.params
        if not p.screen_fraction:
            return None
        x_train = self.shard.x_train
        scale = feature_scale(x_train) if len(x_train) else None
        return WindowScreen(limit=p.screen_limit, fraction=p.screen_fraction, scale=scale)

    def kept(self, x: np.ndarray) -> np.ndarray:
        """(n,) bool: the windows of ``x`` the estimate is made on."""
        screen = self.window_screen()
        return np.ones(len(x), bool) if screen is None else screen.kept(x)

    def decide(self, x: np.ndarray) -> GateDecision:
        """Whether the windows ``x`` are adapted to, with the gate's figures."""
        keep = self.kept(x)
        return self._decide(x, _kept_windows(x, keep))[0]

    def _decide(self, x: np.ndarray, fit: np.ndarray) -> tuple[GateDecision, _Passes]:
        """:meth:`decide`, estimated on the windows kept, and the forward passes it made
        (the adapted model and the embeddings of the kept windows), which
        :meth:`predict` reuses rather than running again."""
        p: FedAPASessionParams = self.ctx.params
        passes = _Passes()
        if not p.adapt_norm or len(x) < p.min_adapt_windows:
            return GateDecision(False, None, None, None), passes
        gate = self.shift_gate() if p.gate else None
        if gate is None or self.q is None or self.available is None:
            return GateDecision(True, None, None, None), passes
        batch = eval_batch_size(self.model, fit.shape[1:])
        shift = gate.shift(*layer_input_sums(self.model, fit, batch, 0).moments())
        available = self.available.numpy().astype(bool)
        q = self.q.numpy()
        passes.trained_z = embed_all(self.model, fit)
        _, passes.adapted, passes.adapted_z = adapted_embeddings(self.model, fit, batch)
        ratio = fit_ratio(
            prototype_fit(passes.adapted_z, q, available),
            prototype_fit(passes.trained_z, q, available),
        )
        return GateDecision(gate.adapts(ratio), shift, ratio, gate.threshold), passes

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The session's labels from its own unlabeled windows ``x`` (module docstring);
        before any Q_i has arrived, the adapted classifier head."""
        p: FedAPASessionParams = self.ctx.params
        keep = self.kept(x)
        fit = _kept_windows(x, keep)
        decision, passes = self._decide(x, fit)
        self.last_decision = decision
        self.last_left_out = len(x) - len(fit)
        every = fit is x  # the passes on the kept windows cover all of x
        trained_z = passes.trained_z if every else None
        if not decision.adapted:
            self._trained_head = (x, _labels(self.model, trained_z, x))
            return self._trained_head[1]
        # the trained head is reported beside the adapted labels (extra_metrics): kept
        # where the gate's pass gives it for free, else left to extra_metrics
        trained = None if trained_z is None else _labels(self.model, trained_z, x)
        self._trained_head = (x, trained)
        if passes.adapted is None:  # no gate ran: the same walk, here
            batch = eval_batch_size(self.model, fit.shape[1:])
            _, passes.adapted, passes.adapted_z = adapted_embeddings(self.model, fit, batch)
        model = passes.adapted
        z = passes.adapted_z if every else None
        if p.inference == "head" or self.q is None or self.available is None:
            return _labels(model, z, x)
        available = self.available.numpy().astype(bool)
        if not available.any():
            return _labels(model, z, x)
        z = embed_all(model, x) if z is None else z
        labels, _ = refine_on(z, keep, self.q.numpy().copy(), available, p.refine_steps)
        return labels

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """The trained model as it predicts an unshifted session (its head with the
        trained statistics); ``mqttfl export`` adds what adapts (the gate, Q_i, the
        refinement settings)."""
        return super().evaluation_model(t)

    def extra_metrics(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """The trained head without adaptation, beside the adapted prediction."""
        seen, head = self._trained_head
        if seen is not x or head is None:
            head = predict_logits(self.model, x).argmax(axis=1)
        metrics = {"head_accuracy": float(np.mean(head == y)) if len(y) else 0.0}
        decision = self.last_decision
        if decision is not None:
            metrics["adapted"] = float(decision.adapted)
            metrics["left_out"] = float(self.last_left_out)
            if decision.shift is not None:
                metrics["shift_score"] = decision.shift
            if decision.ratio is not None and decision.threshold is not None:
                metrics["fit_ratio"] = decision.ratio
                metrics["fit_threshold"] = decision.threshold
        return metrics


ALGORITHMS = (
    Algorithm(
        "fedapa-session",
        FedAPAServer,
        FedAPASessionClient,
        FedAPASessionParams,
        summary="FedAPA without L_c, adapted at test time to the session's unlabeled windows "
        "(BatchNorm statistics, k-means from Q_i)",
    ),
)
