"""Weight counts and sample shapes without torch, read from each model's spec.

The upload gate checks the length of a weight-sharing method's upload against the
announced architecture, and the samples against what it takes. Building the model would
load torch in the coordinator; :mod:`mqttfl.models.specs` answers both from formulas.
"""

from __future__ import annotations

from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.specs import MODEL_SPECS, TAKES, sample_kind


def alp_widths(arch: str) -> tuple[int, ...]:
    """Token width of each ALP layer (FedAli) of a model: one per transformer block."""
    spec = MODEL_SPECS.get(arch)
    return spec.alp_widths if spec is not None else ()


def weight_count(arch: str, *, num_classes: int, embed_dim: int, input_dim: int | None) -> int:
    """Length of the flat weight vector of model ``arch``; ValueError for an unknown one
    (or an MLP without its input width)."""
    spec = MODEL_SPECS.get(arch)
    if spec is None:
        raise ValueError(f"unknown model {arch!r}; known: {', '.join(MODEL_NAMES)}")
    return spec.weight_count(num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)


def takes_shape(arch: str, sample_shape: tuple[int, ...]) -> bool:
    """Whether model ``arch`` can be built for, and run on, samples of this shape."""
    spec = MODEL_SPECS.get(arch)
    return spec is not None and sample_kind(tuple(sample_shape)) == spec.takes


def shape_problem(arch: str, sample_shape: tuple[int, ...]) -> str | None:
    """One line naming the model, the shape and a model that fits; None when it fits."""
    shape = tuple(int(n) for n in sample_shape)
    if takes_shape(arch, shape):
        return None
    spec = MODEL_SPECS.get(arch)
    takes = TAKES[spec.takes if spec is not None else "window"]
    fits = [name for name in MODEL_NAMES if takes_shape(name, shape)]
    hint = f"; a model that fits: {fits[0]!r}" if fits else "; no model takes it"
    return f"model {arch!r} takes {takes}, but the samples have shape {shape}{hint}"
