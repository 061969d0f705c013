"""Cosine k-means from the federation's personalized prototypes (FedAPA-S's refinement)."""

from __future__ import annotations

import numpy as np

#: the most refinement steps a sensor.json or a method may ask for (the k-means from Q_i
#: settles in a few; each step is a pass over the windows)
MAX_REFINE_STEPS = 100


def unit_rows(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    return out


def _nearest(unit: np.ndarray, protos: np.ndarray, available: np.ndarray) -> np.ndarray:
    scores = unit @ protos.T
    scores[:, ~available] = -np.inf
    return np.asarray(scores.argmax(axis=1))


def assign(z: np.ndarray, prototypes: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Each row of ``z``'s most similar prototype (cosine) among the available classes."""
    return _nearest(unit_rows(z), unit_rows(prototypes), available)


def refine_prototypes(
    z: np.ndarray, anchors: np.ndarray, available: np.ndarray, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine k-means started at ``anchors`` (C, d) over the classes in ``available``.

    ``steps`` times: a_n = argmax_c cos(z_n, p_c); p_c = normalize(Σ_{a_n=c} ẑ_n) for
    every class with a window (the others keep p_c). Returns the final assignment (n,)
    and the prototypes (C, d), unit length. Starting at Q_i keeps each cluster's class
    name, so no label of the windows is read. A step that changes no assignment is a
    fixed point (the next would compute the same prototypes), so the steps stop there."""
    unit = unit_rows(z)
    protos = unit_rows(anchors)
    labels = _nearest(unit, protos, available)
    for _ in range(steps):
        for c in np.flatnonzero(available):
            members = unit[labels == c]
            if len(members):
                mean = members.sum(axis=0)
                protos[c] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        moved = _nearest(unit, protos, available)
        if np.array_equal(moved, labels):
            break
        labels = moved
    return labels, protos


def refine_on(
    z: np.ndarray, keep: np.ndarray, anchors: np.ndarray, available: np.ndarray, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`refine_prototypes` on the windows ``keep`` selects (the others left out of
    the estimate, :mod:`mqttfl.adaptation.screen`), then every window of ``z`` assigned to
    the refined prototypes: with every window kept, the k-means' own final assignment."""
    _, protos = refine_prototypes(z[keep], anchors, available, steps)
    return _nearest(unit_rows(z), protos, available), protos
