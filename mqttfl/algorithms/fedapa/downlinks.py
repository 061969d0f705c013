"""FedAPA's downlinks: the typed bodies the server sends after Algorithm 1, the three
encodings of L_c's prototype sets (Eq. 10), and the client's check of what arrived.

Client i gets Q_i (``q``, Eq. 7), or with the global-mean ablations everyone gets one
``global`` set in the broadcast. The sets P that L_c averages over go out one of three ways:

- **exact** (N ≤ k+1 uploads, k = ``max_peer_sets``): every padded set once, in the
  broadcast. Algorithm 1 as written; the default 6-client job.
- **strata** (above k+1, the default): one set per stratum of similar sets, as int8 with a
  scale per set and class; client i gets the weights of its L_c over its own set, the
  sample and (if its stratum's representative was itself) one extra set, and the sums that
  rebuild its own padded set from the upload it kept (:mod:`.peer_sampling`).
- **uniform** (above k+1, ``sampling = "uniform"``): k+1 sets drawn uniformly, as float32,
  with the same per-client fields but no extra set.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from mqttfl.algorithms.base import expect_array
from mqttfl.algorithms.fedapa.params import FedAPAParams
from mqttfl.algorithms.fedapa.peer_sampling import (
    own_set_sums,
    quantize_sets,
    sample_weights,
    set_strata,
    shared_sample,
    strata_weights,
    stratified_sample,
)
from mqttfl.errors import WireError
from mqttfl.wire.schemas import Body

#: The broadcast: ``available`` (C,) uint8, the classes someone holds; the sets as
#: ``prototypes`` (M, C, d) float32, or ``prototypes_int8`` (M, C, d) with
#: ``prototypes_scale`` (M, C); ``global`` (C, d), the ablations' one mean set.
Broadcast = TypedDict(
    "Broadcast",
    {
        "available": np.ndarray,
        "prototypes": np.ndarray,
        "prototypes_int8": np.ndarray,
        "prototypes_scale": np.ndarray,
        "global": np.ndarray,
    },
    total=False,
)


class Personal(TypedDict, total=False):
    """Client i's own part: ``q`` (C, d) Q_i; with a sample, ``set_weights`` (the weights
    of [P_i, *S, *extra] in L_c), ``own_sums`` (C,) and ``extra`` (1, C, d)."""

    q: np.ndarray
    own_sums: np.ndarray
    set_weights: np.ndarray
    extra: np.ndarray


Encoded = tuple[Broadcast, dict[str, Personal]]


def exact_sets(padded: np.ndarray) -> Encoded:
    """Every padded set, once: Eq. 10's (1/N)·Σ_j exactly."""
    return {"prototypes": padded}, {}


def stratified_sets(
    padded: np.ndarray, clients: list[str], *, strata: int, seed: int, t: int
) -> Encoded:
    """One set per stratum of similar sets, as int8; per client its L_c weights."""
    labels = set_strata(padded, strata, seed=seed, t=t)
    reps, alts = stratified_sample(labels, seed=seed, t=t)
    quantized, scale = quantize_sets(padded[reps])
    sums = own_set_sums(padded)
    personal: dict[str, Personal] = {}
    for row, client in enumerate(clients):
        weights, extra = strata_weights(labels, reps, alts, row)
        body: Personal = {"own_sums": sums[row], "set_weights": weights}
        if extra is not None:
            body["extra"] = padded[extra][None]
        personal[client] = body
    return {"prototypes_int8": quantized, "prototypes_scale": scale}, personal


def uniform_sets(
    padded: np.ndarray, clients: list[str], *, size: int, seed: int, t: int
) -> Encoded:
    """``size`` sets drawn uniformly, as float32; per client its L_c weights."""
    n = len(clients)
    sample = shared_sample(n, size, seed=seed, t=t)
    sums = own_set_sums(padded)
    personal: dict[str, Personal] = {
        client: {"own_sums": sums[row], "set_weights": sample_weights(n, sample, row)}
        for row, client in enumerate(clients)
    }
    return {"prototypes": padded[sample]}, personal


def peer_sets(
    padded: np.ndarray, clients: list[str], p: FedAPAParams, *, seed: int, t: int
) -> Encoded:
    """L_c's sets in the encoding the run's size and ``[method]`` call for."""
    k = p.max_peer_sets
    if len(clients) <= k + 1:
        return exact_sets(padded)
    if p.sampling == "strata":
        return stratified_sets(padded, clients, strata=p.strata, seed=seed, t=t)
    return uniform_sets(padded, clients, size=k + 1, seed=seed, t=t)


def check_downlink(broadcast: Body, personal: Body | None, *, classes: int, dim: int) -> None:
    """WireError unless every field present has its shape and kind, and the fields that
    go together came together."""
    c, d = classes, dim
    expect_array(broadcast, "available", (c,), kind="biu")
    expect_array(broadcast, "prototypes", (None, c, d))
    quantized = expect_array(broadcast, "prototypes_int8", (None, c, d), kind="i")
    scale = expect_array(broadcast, "prototypes_scale", (None, c))
    if (quantized is None) != (scale is None) or (
        quantized is not None and scale is not None and len(quantized) != len(scale)
    ):
        raise WireError("missing_field", "int8 sets come with one scale per set and class")
    expect_array(broadcast, "global", (c, d))
    mine = personal or {}
    expect_array(mine, "q", (c, d))
    sums = expect_array(mine, "own_sums", (c,))
    expect_array(mine, "extra", (None, c, d))
    weights = expect_array(mine, "set_weights", (None,))
    if (sums is None) != (weights is None):
        raise WireError("missing_field", "the own set comes with the sample's weights")
    if weights is not None and (weights < 0).any():
        raise WireError("range", "negative sample weights")
