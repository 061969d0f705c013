"""FedAvg (McMahan et al., 2017): sample-weighted average of the client weights.

Server: θ ← Σ_k n_k θ_k / Σ_k n_k over the clients that uploaded this round, computed
separately within each group of identical architecture (model heterogeneity).
Client: plain cross-entropy training; uploads its weights and its sample count only.
"""

from __future__ import annotations

from typing import Any

from mqttfl.algorithms.base import (
    Algorithm,
    ClientSide,
    Context,
    Downlinks,
    ServerSide,
    Upload,
    expect_array,
    expect_map,
)
from mqttfl.algorithms.weights import (
    average_by_group,
    flatten_weights,
    group_key,
    load_weights,
    weights_length,
)
from mqttfl.wire.schemas import ArrayField, ClientInfo, IntField, PayloadSchema


def weights_schema(ctx: Context, info: ClientInfo) -> PayloadSchema:
    return PayloadSchema(
        {
            "weights": ArrayField("float32", (weights_length(ctx, info),)),
            "num_samples": IntField(1, 10**9),
        }
    )


class FedAvgServer(ServerSide):
    def aggregate(self, t: int, uploads: list[Upload]) -> Downlinks:
        weights = {u.client_id: float(u.body["num_samples"]) for u in uploads}
        return Downlinks(broadcast={"weights": average_by_group(uploads, weights)})


class FedAvgClient(ClientSide):
    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return weights_schema(ctx, info)

    def make_upload(self, t: int) -> dict[str, Any]:
        return {"weights": flatten_weights(self.model), "num_samples": len(self.shard.y_train)}

    def check_downlink(self, broadcast: dict[str, Any], personal: dict[str, Any] | None) -> None:
        groups = expect_map(broadcast, "weights")
        expect_array(groups, group_key(self.info), (weights_length(self.ctx, self.info),))

    def receive(self, t: int, broadcast: dict[str, Any], personal: dict[str, Any] | None) -> None:
        global_weights = broadcast.get("weights", {}).get(group_key(self.info))
        if global_weights is not None:
            load_weights(self.model, global_weights)


ALGORITHMS = (
    Algorithm("fedavg", FedAvgServer, FedAvgClient, summary="sample-weighted weight averaging"),
)
