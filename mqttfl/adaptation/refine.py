"""Cosine k-means from the federation's personalized prototypes (FedAPA-S's refinement)."""

from __future__ import annotations

import numpy as np


def refine_prototypes(
    z: np.ndarray, anchors: np.ndarray, available: np.ndarray, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine k-means started at ``anchors`` (C, d) over the classes in ``available``.

    ``steps`` times: a_n = argmax_c cos(z_n, p_c); p_c = normalize(Σ_{a_n=c} ẑ_n) for
    every class with a window (the others keep p_c). Returns the final assignment (n,)
    and the prototypes (C, d), unit length. Starting at Q_i keeps each cluster's class
    name, so no label of the windows is read."""
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
