"""FedAPA-S: FedAPA's bytes, adapted to the recording session a deployed sensor sees.

Issue 24 and docs/sessions.md: tested on a day it never trained on, FedAPA fell below
Local on ESPectre. Two parts of it were diagnosed as the loss (docs/sessions.md):

1. **The normalization statistics.** BatchNorm's running mean and variance are fitted to
   the training sessions, whose receiver gain and static multipath differ from the new
   session's; the class prototypes of a client move between its sessions by about as much
   as the classes lie apart. Re-estimating them on the unlabeled windows of the session
   being classified (AdaBN: Li et al., "Revisiting Batch Normalization For Practical
   Domain Adaptation", ICLR-W 2017) recovers most of the loss, for every method.
2. **L_c** (Eq. 10). It pulls each embedding toward every client's own prototypes, each
   fitted to that client's own session; across sessions those are the wrong targets.
   FedAPA-S keeps L_g toward the personalized Q_i (Eqs. 5-9, 11, 12 without L_c), so the
   downlink is Q_i alone: 2·C·d floats per client-round with the upload.

At test time (:meth:`FedAPASessionClient.predict`), on the windows ``x`` of the session
being classified, which a deployed sensor has all day without labels:

- :func:`renormalize`: the BatchNorm statistics are recomputed on ``x`` (the cumulative
  mean of the batches' statistics, AdaBN), on a copy of the trained model;
- :func:`refine_prototypes`: the adapted embeddings are clustered by cosine k-means
  started at the client's Q_i (the federation's personalized class prototypes, so the
  clusters keep their class names): each step assigns every window to its most similar
  prototype and moves each prototype to the normalized mean of its windows (a class with
  no window keeps its prototype). The prediction is the final assignment
  (``refine_steps = 0``: the nearest Q_i, no refinement; ``inference = "head"``: the
  adapted classifier head instead).

Nothing of the test session crosses the wire and no label of it is read. With fewer than
``min_adapt_windows`` windows the statistics stay as trained (too few to estimate them).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from mqttfl.algorithms.base import Algorithm
from mqttfl.algorithms.fedapa import FedAPAClient, FedAPAParams, FedAPAServer
from mqttfl.errors import MqttflError
from mqttfl.training.lazy import lazy_import, no_grad
from mqttfl.training.loops import batches, embed_all, predict_logits

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from mqttfl.models import EmbeddingModel
else:
    torch = lazy_import("torch")
    F = lazy_import("torch.nn.functional")
    nn = lazy_import("torch.nn")


class FedAPASessionParams(FedAPAParams):
    """FedAPA's parameters (τ, λ, T_warm) without L_c by default, and the test time's."""

    use_client_prototypes: bool = False
    #: re-estimate BatchNorm statistics on the windows being classified (AdaBN)
    adapt_norm: bool = True
    #: "prototypes": cosine k-means from Q_i on the adapted embeddings, ``refine_steps``
    #: steps (0: the nearest Q_i); "head": the (adapted) classifier head
    inference: Literal["prototypes", "head"] = "prototypes"
    refine_steps: int = Field(5, ge=0)
    min_adapt_windows: int = Field(8, ge=2)


@no_grad
def renormalize(model: EmbeddingModel, x: np.ndarray, batch_size: int = 256) -> EmbeddingModel:
    """A copy of ``model`` whose BatchNorm running statistics are those of ``x``: each
    layer's running mean and (unbiased) variance become the cumulative average over the
    batches of ``x`` of the batch statistics of that layer's input (AdaBN); every weight,
    and the affine γ, β, is kept."""
    adapted = copy.deepcopy(model)
    norms = [m for m in adapted.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for layer in norms:
        layer.reset_running_stats()
        layer.momentum = None  # cumulative moving average: equal weight per batch
    adapted.train()
    for xb, _ in batches(x, np.zeros(len(x)), batch_size, None):
        adapted.embed(xb)
    adapted.eval()
    return adapted


def refine_prototypes(
    z: np.ndarray, anchors: np.ndarray, available: np.ndarray, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine k-means started at ``anchors`` (C, d) over the classes in ``available``.

    ``steps`` times: a_n = argmax_c cos(z_n, p_c); p_c = normalize(Σ_{a_n=c} ẑ_n) for
    every class with a window (the others keep p_c). Returns the final assignment (n,)
    and the prototypes (C, d), unit length."""
    unit = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    protos = anchors / np.maximum(np.linalg.norm(anchors, axis=1, keepdims=True), 1e-12)

    def assign(p: np.ndarray) -> np.ndarray:
        scores = unit @ p.T
        scores[:, ~available] = -np.inf
        return np.asarray(scores.argmax(axis=1))

    labels = assign(protos)
    for _ in range(steps):
        for c in np.flatnonzero(available):
            members = unit[labels == c]
            if len(members):
                mean = members.sum(axis=0)
                protos[c] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        labels = assign(protos)
    return labels, protos


class FedAPASessionClient(FedAPAClient):
    """FedAPA's client (L_ce + λ_t L_g, with L_c only if asked) that classifies a session
    after adapting to it (module docstring)."""

    def adapted_model(self, x: np.ndarray) -> EmbeddingModel:
        p: FedAPASessionParams = self.ctx.params
        if p.adapt_norm and len(x) >= p.min_adapt_windows:
            return renormalize(self.model, x)
        return self.model

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The session's labels from its own unlabeled windows ``x`` (module docstring);
        before any Q_i has arrived, the adapted classifier head."""
        p: FedAPASessionParams = self.ctx.params
        model = self.adapted_model(x)
        head: np.ndarray = predict_logits(model, x).argmax(axis=1)
        if p.inference == "head" or self.q is None or self.available is None:
            return head
        available = self.available.numpy().astype(bool)
        if not available.any():
            return head
        labels, _ = refine_prototypes(
            embed_all(model, x), self.q.numpy().copy(), available, p.refine_steps
        )
        return labels

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """None that is fixed: :meth:`predict` adapts to each session's own windows (its
        BatchNorm statistics, k-means from Q_i), which one exported module cannot carry."""
        raise MqttflError(
            "method fedapa-session adapts to each session's unlabeled windows when it "
            "predicts (BatchNorm statistics, k-means from Q_i); no fixed model reproduces "
            "that, so mqttfl export does not take it"
        )

    def extra_metrics(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """The trained head without adaptation, beside the adapted prediction."""
        head = predict_logits(self.model, x).argmax(axis=1)
        return {"head_accuracy": float(np.mean(head == y)) if len(y) else 0.0}


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
