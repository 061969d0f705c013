"""FedAPA's server: Algorithm 1. Eqs. 5-8 over the round's prototype uploads (summed while
they arrive where it can, :mod:`.fanin`), then the downlinks (:mod:`.downlinks`).

In buffered mode (:mod:`mqttfl.engine.buffered`) each client's newest set counts, with
its staleness weight s(τ_j): Q_i^c = Σ_j α_ij^c p_j^c with α_ij^c ∝ s(τ_j)·exp(cos(p_i^c,
p_j^c)/τ) (Eqs. 5-7), and Eq. 8's padding is the s-weighted mean over holders. p_j is the
newest set client j reported, computed by its model of version u_j - 1, so Q_i is the
similarity-weighted consensus of the peers' newest sets, of mixed ages, where a set τ
versions old counts s(τ) times as much as a fresh one of the same similarity (its
embedding space has drifted from the current one by τ aggregations). Every client in the
latest set gets its Q_i.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mqttfl.algorithms.base import Context, Downlinks, ServerSide, Upload
from mqttfl.algorithms.common.prototype_uploads import stack_uploads, uploaded_prototypes
from mqttfl.algorithms.fedapa.downlinks import Broadcast, Personal, peer_sets
from mqttfl.algorithms.fedapa.equations import aggregate_prototypes, warmup_lambda, warmup_length
from mqttfl.algorithms.fedapa.fanin import FanIn
from mqttfl.algorithms.fedapa.params import FedAPAParams
from mqttfl.logs import get_logger
from mqttfl.wire.control import Number


class FedAPAServer(ServerSide):
    keeps_latest = True  # buffered mode: each client's newest prototype set

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.warmup_rounds = warmup_length(ctx.rounds, ctx.params.warmup_rounds)
        self.fan_in: FanIn | None = None
        if self.warmup_rounds > ctx.rounds:
            get_logger().warning(
                "fedapa.warmup_exceeds_run",
                warmup_rounds=self.warmup_rounds,
                rounds=ctx.rounds,
                reason="λ_t never reaches lambda_max in this run",
            )

    def round_params(self, t: int) -> dict[str, Number]:
        p: FedAPAParams = self.ctx.params
        lam = warmup_lambda(
            t, lambda_min=p.lambda_min, lambda_max=p.lambda_max, warmup_rounds=self.warmup_rounds
        )
        return {"lambda": lam}

    def prepare(self, t: int, upload: Upload) -> None:
        """Sum Eqs. 5-7's pairs while round ``t``'s uploads arrive (synchronous rounds)."""
        p: FedAPAParams = self.ctx.params
        if p.aggregation != "similarity":
            return
        if self.fan_in is None or self.fan_in.t != t:
            self.fan_in = FanIn(t, self.ctx.num_classes, self.ctx.embed_dim, p.tau)
        self.fan_in.add(upload.client_id, uploaded_prototypes(upload))

    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        p: FedAPAParams = self.ctx.params
        fan_in, self.fan_in, early = self.fan_in, None, None
        clients = [u.client_id for u in uploads]
        if fan_in and staleness is None and fan_in.covers(t, clients, [u.body for u in uploads]):
            early, protos, mask = fan_in.personalized(clients)
        else:  # another set than arrived (a resumed round, a dropped offender), or weighted
            protos, mask = stack_uploads(uploads, self.ctx.num_classes, self.ctx.embed_dim)
        stale = [(staleness or {}).get(u.client_id, 1.0) for u in uploads]
        q, padded, available = aggregate_prototypes(
            protos,
            mask,
            tau=p.tau,
            similarity=p.aggregation == "similarity",
            weights=np.asarray(stale) if staleness else None,
            personalized=early,
        )
        broadcast: Broadcast = {"available": available.astype(np.uint8)}
        personal: dict[str, Personal] = {c: {} for c in clients}
        if p.use_client_prototypes:
            sets, own = peer_sets(padded, clients, p, seed=self.ctx.seed, t=t)
            broadcast.update(sets)
            for client, body in own.items():
                personal[client].update(body)
        if p.aggregation == "mean":  # one global set: send it once, not per client
            broadcast["global"] = q[0] if len(q) else q.reshape(0, self.ctx.embed_dim)
        else:
            for row, client in enumerate(clients):
                personal[client]["q"] = q[row]
        return Downlinks(
            broadcast=broadcast,
            personal={c: b for c, b in personal.items() if b},
        )
