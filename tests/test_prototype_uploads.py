"""A prototype method uploads only what its server side reads: per-class counts go up only
for FedProto's sample-weighted bank; FedAPA (Eq. 8 pads with the plain mean) and FedSAP
(Eq. 2 is the plain mean over holders) keep the label histogram on the device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Context
from mqttfl.config import TrainConfig
from mqttfl.data.shard import Shard
from mqttfl.models import build_model
from mqttfl.wire.schemas import ClientInfo

INFO = ClientInfo("0", "tiny", (0, 1, 2), 12, (8, 6))


def _upload(name: str, **params: object) -> tuple[set[str], set[str]]:
    """(schema fields, fields of a real upload) of one client after one round of training."""
    algorithm = get_algorithm(name)
    ctx = Context(num_classes=3, embed_dim=4, rounds=2, seed=0, params=algorithm.params(**params))
    rng = np.random.default_rng(0)
    y = np.arange(16) % 3
    x = (rng.normal(size=(16, 8, 6)) + y[:, None, None]).astype(np.float32)
    torch.manual_seed(0)
    model = build_model("tiny", num_classes=3, embed_dim=4)
    client = algorithm.client(
        ctx, INFO, model, Shard(x[:12], y[:12], x[12:], y[12:], {}), TrainConfig(batch_size=4)
    )
    client.train(1, {"lambda": 0.0}, np.random.default_rng(1))
    body = client.make_upload(1)
    schema = algorithm.upload_schema(ctx, INFO)
    schema.validate(body)
    return set(schema.fields), set(body)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("fedapa", {}),
        ("fedapa-global-avg", {}),
        ("fedapa-global-avg-client-protos", {}),
        ("fedsap", {}),
        ("fedproto", {}),
        ("fedproto", {"proto_weighting": "mean"}),
    ],
)
def test_unweighted_servers_get_prototypes_only(name: str, params: dict[str, object]) -> None:
    assert _upload(name, **params) == ({"classes", "prototypes"},) * 2


def test_fedproto_sample_weighting_is_the_one_server_that_reads_counts() -> None:
    fields = {"classes", "prototypes", "counts"}
    assert _upload("fedproto", proto_weighting="samples") == (fields, fields)
