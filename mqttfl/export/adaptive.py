"""The graph of a model that adapts its normalization to the session it classifies.

A method with ``adapt_norm`` (FedAPA-S, :mod:`mqttfl.algorithms.fedapa.session`)
re-estimates each BatchNorm layer's statistics on the unlabeled windows it classifies.
One ONNX graph with fixed statistics cannot do that, so the exported graph takes them as
inputs and reports what the runtime needs to compute them:

- inputs: ``x`` (a batch of windows) and ``norm_stats`` (2, ΣC_k) float32: the means
  of every BatchNorm layer's channels, concatenated in forward order, over their
  variances; each layer normalizes with its slice (``F.batch_norm`` in inference mode,
  the layer's own γ, β and ε);
- outputs: ``scores`` (the classifier head's logits), ``embedding`` (r(h), for the
  k-means from Q_i), ``norm_moments`` (2, ΣC_k) float64, the batch's per-channel sums of
  each layer's input over their sums of squares, and ``norm_counts`` (K,) float64, how
  many values each of layer k's channel sums holds (windows x spatial positions).

So the runtime computes the layered statistics of :mod:`mqttfl.training.normstats` with
K passes: pass k feeds the adapted statistics of the layers before k and reads layer k's
moments (which do not depend on the statistics of k or any later layer).
:mod:`mqttfl.sensing.adapt` does this with numpy and onnxruntime.

A model without BatchNorm (the MLP on feature vectors) has no statistics to adapt; FedAPA-S
still predicts with the session's k-means from Q_i there (and no gate: adapting changes
no embedding, so its fit ratio is 1). Its graph is ``x -> (scores, embedding)``
(:class:`EmbeddingGraph`), and its ``adaptation`` section lists no layers.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mqttfl.export.trace import Exporter, trace_onnx
from mqttfl.models.base import EmbeddingModel
from mqttfl.sensing.adapt import Adapter, stat_matrix
from mqttfl.sensing.adaptive_spec import AdaptationSpec

SCORES, EMBEDDING = "scores", "embedding"
STATS, MOMENTS, COUNTS = "norm_stats", "norm_moments", "norm_counts"


class _Feed:
    """What the replaced layers share during one forward: the statistics to normalize
    with, and the moments each layer saw."""

    def __init__(self) -> None:
        self.stats: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.moments: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []


class _GivenNorm(nn.Module):
    """A BatchNorm layer that normalizes with statistics given at call time, and records
    its input's per-channel sum, sum of squares and count (float64)."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, index: int, feed: _Feed) -> None:
        super().__init__()
        self.index = index
        self.eps = float(layer.eps)
        self.weight = layer.weight
        self.bias = layer.bias
        self.feed = [feed]  # a list: not a submodule

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        feed = self.feed[0]
        mean, var = feed.stats[self.index]
        wide = h.double()
        dims = [0, *range(2, h.dim())]
        count = torch.ones_like(wide[:, 0]).sum()
        feed.moments.append((wide.sum(dim=dims), (wide * wide).sum(dim=dims), count))
        return F.batch_norm(h, mean, var, self.weight, self.bias, False, 0.0, self.eps)


def norm_layers(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """The model's BatchNorm layers with their names, in registration order (the forward
    order of every shipped model)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]


class AdaptiveGraph(nn.Module):
    """``(x, norm_stats) -> (scores, embedding, norm_moments, norm_counts)`` for a copy of
    ``model`` (module docstring). ``norm_stats`` is (2, ΣC_k): the means of every layer's
    channels, concatenated in forward order, over their variances; ``norm_moments`` is
    (2, ΣC_k) float64, the batch's sums over its sums of squares; ``norm_counts`` (K,)."""

    def __init__(self, model: EmbeddingModel) -> None:
        super().__init__()
        import copy

        self.model = copy.deepcopy(model).eval()
        self.feed = _Feed()
        self.channels: list[int] = []
        self.names: list[str] = []
        for index, (name, module) in enumerate(norm_layers(self.model)):
            parent_name, _, attr = name.rpartition(".")
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            setattr(parent, attr, _GivenNorm(module, index, self.feed))
            self.channels.append(int(module.num_features))
            self.names.append(name)

    def forward(self, x: torch.Tensor, stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bounds = np.cumsum([0, *self.channels])
        self.feed.stats = [
            (stats[0, int(a) : int(b)], stats[1, int(a) : int(b)])
            for a, b in itertools.pairwise(bounds)
        ]
        self.feed.moments = []
        z = self.model.embed(x)
        scores = self.model.classify(z)
        moments, self.feed.moments = self.feed.moments, []
        sums = torch.cat([m[0] for m in moments])
        squares = torch.cat([m[1] for m in moments])
        counts = torch.stack([m[2] for m in moments])
        return scores, z, torch.stack([sums, squares]), counts


class EmbeddingGraph(nn.Module):
    """``x -> (scores, embedding)`` for a copy of a model without BatchNorm."""

    def __init__(self, model: EmbeddingModel) -> None:
        super().__init__()
        import copy

        self.model = copy.deepcopy(model).eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.model.embed(x)
        return self.model.classify(z), z


def export_adaptive(
    graph: AdaptiveGraph | EmbeddingGraph,
    example: np.ndarray,
    stats: list[tuple[np.ndarray, np.ndarray]],
    path: Path,
    opset: int,
) -> Exporter:
    """Trace ``graph`` (:func:`mqttfl.export.trace.trace_onnx`: a dynamic batch axis on
    ``x`` and on the per-window outputs). An :class:`EmbeddingGraph` takes no statistics
    (``stats`` is empty). Returns the exporter that wrote the file."""
    dynamic = {"x": {0: "batch"}, SCORES: {0: "batch"}, EMBEDDING: {0: "batch"}}
    inputs: tuple[torch.Tensor, ...] = (torch.from_numpy(example),)
    names, outputs = ["x"], [SCORES, EMBEDDING]
    if isinstance(graph, AdaptiveGraph):
        inputs += (torch.from_numpy(stat_matrix(stats)),)
        names, outputs = ["x", STATS], [SCORES, EMBEDDING, MOMENTS, COUNTS]
    return trace_onnx(
        graph,
        inputs,
        path,
        input_names=names,
        output_names=outputs,
        dynamic_axes=dynamic,
        opset=opset,
    )


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def adaptation_spec(method: Any, model: EmbeddingModel, name: str) -> AdaptationSpec:
    """What adapts, from a client of a method with ``adapt_norm``: the trained statistics,
    Q_i and its classes, the refinement settings, the gate (None with ``gate = false`` or
    without BatchNorm) and the screen (None where the method leaves no window out)."""
    from mqttfl.training.normstats import trained_statistics

    p = method.ctx.params
    trained = trained_statistics(model)
    q, available = getattr(method, "q", None), getattr(method, "available", None)
    gate = method.shift_gate() if getattr(p, "gate", True) else None
    screen = method.window_screen() if hasattr(method, "window_screen") else None
    return AdaptationSpec(
        layers=tuple(name for name, _ in norm_layers(model)),
        channels=tuple(len(mean) for mean, _ in trained),
        trained_mean=tuple(mean for mean, _ in trained),
        trained_var=tuple(var for _, var in trained),
        inference=str(getattr(p, "inference", "prototypes")),
        prototypes=None if q is None else np.asarray(q.numpy(), np.float64),
        available=None if available is None else np.asarray(available.numpy(), bool),
        refine_steps=int(getattr(p, "refine_steps", 0)),
        min_adapt_windows=int(getattr(p, "min_adapt_windows", 2)),
        tau=float(getattr(p, "tau", 1.0)),
        gate=gate,
        method=name,
        screen=screen,
    )


def export_adapting(
    method: Any, name: str, x: np.ndarray, batch: int, path: Path, opset: int
) -> tuple[AdaptationSpec, dict[str, Any]]:
    """Write the adaptive graph of ``method``'s model to ``path`` and check it against
    torch on ``x``: the scores and embeddings with the trained and with the adapted
    statistics (torch's :func:`~mqttfl.training.normstats.adapted_statistics`), the
    sensor's layered statistics against torch's, and the sensor's transductive prediction
    against the method's own ``predict``. Returns the section and the check's figures."""
    from mqttfl.training.loops import embed_all, predict_logits
    from mqttfl.training.memory import release
    from mqttfl.training.normstats import adapted_statistics, with_statistics

    model: EmbeddingModel = method.model
    spec = adaptation_spec(method, model, name)
    graph = AdaptiveGraph(model) if spec.normalizes else EmbeddingGraph(model)
    trained = spec.trained_statistics()
    exporter = export_adaptive(
        graph, np.ascontiguousarray(x[: min(len(x), 4)]), trained, path, opset
    )
    # torch's side first, its heap handed back, then onnxruntime's: on a 512 MB board the
    # two working sets do not fit at once
    torch_stats = adapted_statistics(model, x, batch) if spec.normalizes and len(x) >= 2 else []
    references: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    if len(x) >= 2:
        models = [(stat_matrix(trained), model)]
        if torch_stats:
            models.append((stat_matrix(torch_stats), with_statistics(model, torch_stats)))
        references = [
            (stats, predict_logits(reference, x, batch), embed_all(reference, x, batch))
            for stats, reference in models
        ]
        del models
    predicted = method.predict(x)
    release(collect=True)
    adapter = Adapter(_session(path), "x", spec)
    deviation = 0.0
    stats_deviation = 0.0
    for stats, logits, embedded in references:
        scores = adapter.head_scores(x, stats, SCORES)
        z = adapter.embeddings(x, stats)
        deviation = max(
            deviation,
            float(np.max(np.abs(scores - logits))),
            float(np.max(np.abs(z - embedded))),
        )
    for (mean, var), (t_mean, t_var) in zip(
        adapter.layered_statistics(x) if torch_stats else [], torch_stats, strict=True
    ):
        scale = np.maximum(np.abs(t_var), 1.0)  # |difference| / max(1, var)
        stats_deviation = max(
            stats_deviation,
            float(np.max(np.abs(mean - t_mean) / scale)),
            float(np.max(np.abs(var - t_var) / scale)),
        )
    adaptation, labels = adapter.adapt(x)
    if labels is None:
        labels = adapter.scores(adaptation, x, SCORES).argmax(axis=1)
    agreement = float(np.mean(labels == predicted)) if len(x) else 1.0
    checks = {
        "exporter": exporter,
        "adapts": True,
        "max_abs_diff_adaptive_vs_torch": deviation,
        "statistics_max_rel_diff_vs_torch": stats_deviation,
        "transductive_agreement_vs_torch": agreement,
        "adapted_on_checked_windows": adaptation.adapted,
    }
    return spec, checks
