"""CARING (Li et al., IEEE TMC 2023), the FedAPA paper's "FedCaring" baseline.

CARING aggregates local models with one of two weights, 1 and 0.3, chosen by each
local model's performance (FedAPA Sec. VI-C). Here a client uploads its weights, its
sample count and its local performance: the accuracy of its freshly trained model on
its own training split (its test split stays for evaluation only). Within each group of
identical architecture, a client at or above the group's mean (or median) local accuracy
gets weight ``caring_high`` = 1, the others ``caring_low`` = 0.3, and the server forms
Σ_k w_k θ_k / Σ_k w_k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import Algorithm, Context, Downlinks, Upload
from mqttfl.algorithms.common.weights import (
    ModelVersions,
    WeightsUpload,
    average_by_group,
    group_key,
    weights_length,
)
from mqttfl.algorithms.fedavg import FedAvgClient
from mqttfl.training.loops import predict_logits
from mqttfl.wire.schemas import ArrayField, Body, ClientInfo, FloatField, IntField, PayloadSchema


class FedCaringParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    caring_high: float = Field(1.0, gt=0)
    caring_low: float = Field(0.3, gt=0)
    caring_threshold: Literal["mean", "median"] = "mean"


class CaringUpload(WeightsUpload):
    """FedCaring's upload: FedAvg's, and the client's accuracy on its training set."""

    local_accuracy: float


def caring_weights(
    performance: dict[str, float], *, high: float = 1.0, low: float = 0.3, threshold: str = "mean"
) -> dict[str, float]:
    """Weight ``high`` for clients whose local performance reaches the group's mean
    (or median), ``low`` for the rest."""
    values = np.asarray(list(performance.values()), dtype=np.float64)
    cut = float(np.median(values) if threshold == "median" else np.mean(values))
    return {client: high if value >= cut - 1e-12 else low for client, value in performance.items()}


class FedCaringServer(ModelVersions):
    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        p: FedCaringParams = self.ctx.params
        groups: dict[str, dict[str, float]] = {}
        for upload in uploads:
            accuracy = float(cast("CaringUpload", upload.body)["local_accuracy"])
            groups.setdefault(group_key(upload.info), {})[upload.client_id] = accuracy
        weights: dict[str, float] = {}
        for group_accuracy in groups.values():
            weights.update(
                caring_weights(
                    group_accuracy,
                    high=p.caring_high,
                    low=p.caring_low,
                    threshold=p.caring_threshold,
                )
            )
        return Downlinks(broadcast={"weights": average_by_group(uploads, weights)})


class FedCaringClient(FedAvgClient):
    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return PayloadSchema(
            {
                "weights": ArrayField("float32", (weights_length(ctx, info),)),
                "num_samples": IntField(1, 10**9),
                "local_accuracy": FloatField(0.0, 1.0),
            }
        )

    def make_upload(self, t: int) -> Body:
        """Weights, sample count, training accuracy. With [privacy] on, the accuracy
        (sensitivity 1) is released beside the update as one Gaussian mechanism: the
        vector (Δ/S, acc) has sensitivity √2, so both get noise √2·z (in units of S and
        of 1) and the upload stays one mechanism of multiplier z; the noisy accuracy is
        then clamped to [0, 1] (post-processing)."""
        predicted = predict_logits(self.model, self.shard.x_train).argmax(axis=1)
        accuracy = float(np.mean(predicted == self.shard.y_train))
        privacy = self.ctx.privacy
        if privacy is None:
            weights, samples = self.shared_weights()
        else:
            weights, samples = self.shared_weights(noise_scale=math.sqrt(2.0))
            noise = self.noise().normal(0.0, math.sqrt(2.0) * privacy.noise_multiplier)
            accuracy = min(1.0, max(0.0, accuracy + float(noise)))
        return self.declared(
            {"weights": weights, "num_samples": samples, "local_accuracy": accuracy}
        )


ALGORITHMS = (
    Algorithm(
        "fedcaring",
        FedCaringServer,
        FedCaringClient,
        FedCaringParams,
        summary="weights 1 / 0.3 by local performance in aggregation (CARING)",
    ),
)
