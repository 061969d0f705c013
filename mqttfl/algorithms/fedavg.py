"""FedAvg (McMahan et al., 2017): sample-weighted average of the client weights.

Server: θ ← Σ_k n_k θ_k / Σ_k n_k over the clients that uploaded this round, computed
separately within each group of identical architecture (model heterogeneity).
Client: plain cross-entropy training; uploads its weights and its sample count only.
With ``[privacy]`` on, DP-FedAvg (McMahan et al., ICLR 2018): the update since the last
global weights is clipped and noised on the device, and the sample count is the public
constant 1 (:func:`~mqttfl.privacy.mechanism.private_update`, sensitivity derived there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mqttfl.algorithms.base import (
    Algorithm,
    ClientSide,
    Context,
    Downlinks,
    Upload,
    expect_array,
    expect_map,
)
from mqttfl.algorithms.common.weights import (
    ModelVersions,
    average_by_group,
    flatten_weights,
    group_key,
    load_weights,
    uploaded_weights,
    weights_length,
)
from mqttfl.privacy.mechanism import private_update
from mqttfl.wire.schemas import ArrayField, Body, ClientInfo, IntField, PayloadSchema


def weights_schema(ctx: Context, info: ClientInfo) -> PayloadSchema:
    return PayloadSchema(
        {
            "weights": ArrayField("float32", (weights_length(ctx, info),)),
            "num_samples": IntField(1, 10**9),
        }
    )


class FedAvgServer(ModelVersions):
    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        weights = {u.client_id: float(uploaded_weights(u)["num_samples"]) for u in uploads}
        return Downlinks(broadcast={"weights": average_by_group(uploads, weights)})


class FedAvgClient(ClientSide):
    supports_privacy = True
    broadcast_supersedes = True  # receive() loads the global weights whole

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # θ_start of DP-FedAvg: the last global weights (public: they are post-processed
        # noisy uploads), or the seeded initial model before any arrived
        self.start = flatten_weights(self.model) if self.ctx.privacy is not None else None

    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return weights_schema(ctx, info)

    def shared_weights(self, *, noise_scale: float = 1.0) -> tuple[np.ndarray, int]:
        """(weights, sample count) to upload: as trained, or with [privacy] on the
        DP-FedAvg release θ_start + clip(Δ, S) + N(0, (z·noise_scale·S)²) and count 1."""
        flat = flatten_weights(self.model)
        privacy = self.ctx.privacy
        if privacy is None or self.start is None:
            return flat, len(self.shard.y_train)
        noisy = private_update(
            flat,
            self.start,
            clip=privacy.clip,
            noise_multiplier=privacy.noise_multiplier * noise_scale,
            rng=self.noise(),
        )
        return noisy, 1

    def make_upload(self, t: int) -> Body:
        weights, samples = self.shared_weights()
        return self.declared({"weights": weights, "num_samples": samples})

    def check_downlink(self, broadcast: Body, personal: Body | None) -> None:
        groups = expect_map(broadcast, "weights")
        expect_array(groups, group_key(self.info), (weights_length(self.ctx, self.info),))

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        length = weights_length(self.ctx, self.info)
        global_weights = expect_array(
            expect_map(broadcast, "weights"), group_key(self.info), (length,)
        )
        if global_weights is not None:
            load_weights(self.model, global_weights)
            if self.start is not None:
                self.start = np.array(global_weights, np.float32)


ALGORITHMS = (
    Algorithm("fedavg", FedAvgServer, FedAvgClient, summary="sample-weighted weight averaging"),
)
