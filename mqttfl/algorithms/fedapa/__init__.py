"""FedAPA: adaptive prototype aggregation (Guo, Mao and Ho, "FedAPA: Federated
Learning with Adaptive Prototype Aggregation Toward Heterogeneous Wi-Fi CSI-based Crowd
Counting", arXiv:2511.21048).

Clients share class prototypes only (Eq. 4): no per-class sample counts, since the
server never reads them (Eq. 8 pads with the plain mean over holders), and a label
histogram is more than the paper's privacy argument (prototypes only) hands over. The
server weighs peers' prototypes by cosine similarity (Eq. 5) through a softmax with
temperature τ (Eq. 6) into one personalized prototype set Q_i per client (Eq. 7), pads
the classes a client lacks with the mean over the clients that have them in both Q_i
and P_i (Eq. 8), and returns Q_i to client i and the full padded set P to everyone
(Algorithm 1). The client adds λ_t·(L_g + L_c) to its cross-entropy (Eq. 12), where
L_g aligns embeddings with Q_i (Eq. 9), L_c with every client's P_j (Eq. 10), and λ_t
follows the cosine warm-up of Eq. 11 (Algorithm 2).

**Bounded downlinks** (:mod:`~mqttfl.algorithms.fedapa.downlinks`,
:mod:`~mqttfl.algorithms.fedapa.peer_sampling`). With more than k+1
uploads (k = ``max_peer_sets``) the broadcast carries a sample S of k+1 padded sets, by
default one per stratum of similar sets as int8, and client i's personal downlink the
weights of its L_c: an unbiased estimate of Eq. 10's (1/N)·Σ_j at a bounded size. With
N ≤ k+1, S is every set with no weights, exactly Algorithm 1 (the default 6-client job).

The two Table IV ablations reuse this module: ``fedapa-global-avg`` replaces Eqs. 5-7
with one plain mean per class and drops L_c; ``fedapa-global-avg-client-protos`` keeps
the plain mean and keeps L_c.

The folder holds the method whole: the equations (:mod:`.equations`), its ``[method]``
keys (:mod:`.params`), the server (:mod:`.server`) with Eqs. 5-7 summed while uploads
arrive (:mod:`.fanin`), the downlinks' encodings (:mod:`.downlinks`, :mod:`.peer_sampling`),
the client (:mod:`.client`) and FedAPA-S, its session-adapting variant (:mod:`.session`).
"""

from __future__ import annotations

from mqttfl.algorithms.base import Algorithm
from mqttfl.algorithms.fedapa import session
from mqttfl.algorithms.fedapa.client import FedAPAClient
from mqttfl.algorithms.fedapa.equations import (
    aggregate_prototypes,
    personalized_prototypes,
    prototype_contrast,
    similarity_weights,
    warmup_lambda,
    warmup_length,
)
from mqttfl.algorithms.fedapa.params import (
    FedAPAParams,
    GlobalAvgClientProtosParams,
    GlobalAvgParams,
)
from mqttfl.algorithms.fedapa.server import FedAPAServer

ALGORITHMS = (
    Algorithm(
        "fedapa",
        FedAPAServer,
        FedAPAClient,
        FedAPAParams,
        summary="similarity-weighted personalized prototypes (FedAPA)",
    ),
    Algorithm(
        "fedapa-global-avg",
        FedAPAServer,
        FedAPAClient,
        GlobalAvgParams,
        summary="FedAPA ablation: global mean prototypes, no L_c",
    ),
    Algorithm(
        "fedapa-global-avg-client-protos",
        FedAPAServer,
        FedAPAClient,
        GlobalAvgClientProtosParams,
        summary="FedAPA ablation: global mean prototypes with L_c",
    ),
    *session.ALGORITHMS,
)

__all__ = [
    "ALGORITHMS",
    "FedAPAClient",
    "FedAPAParams",
    "FedAPAServer",
    "aggregate_prototypes",
    "personalized_prototypes",
    "prototype_contrast",
    "similarity_weights",
    "warmup_lambda",
    "warmup_length",
]
