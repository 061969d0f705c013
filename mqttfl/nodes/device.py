"""What a client device is made of, built one way for every place that trains one: the
client runner (:mod:`mqttfl.nodes.client`, also inside a fleet) and the Local
reference of `mqttfl run` (:mod:`mqttfl.evaluation.reference`), which must train exactly as a Local
client would.

Torch loads on the first build, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mqttfl.training.lazy import torch
from mqttfl.wire.ids import client_number
from mqttfl.wire.schemas import ClientInfo

if TYPE_CHECKING:
    from mqttfl.algorithms.base import Algorithm, ClientSide, Context
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard


def build_client_side(
    config: RunConfig, algorithm: Algorithm, ctx: Context, client_id: str, shard: Shard
) -> ClientSide:
    """The method's client side for ``client_id``, with its model (``.model``) and its
    announcement (``.info``).

    Seeds torch's global generator with ``config.seed`` just before building the model,
    so every client of an architecture starts from the same weights; builds in one
    process must therefore not interleave.
    """
    from mqttfl.data.shapes import check_shard_shape

    check_shard_shape(config, client_id, shard)  # one clear line, not a torch traceback
    arch = config.model.arch_of(client_id)
    torch.manual_seed(config.seed)  # identical initial weights per architecture
    sample_shape = tuple(int(n) for n in shard.x_train.shape[1:])
    from mqttfl.models import build_model

    model = build_model(
        arch,
        num_classes=config.model.num_classes,
        embed_dim=config.model.embed_dim,
        input_dim=sample_shape[0] if len(sample_shape) == 1 else None,
    )
    info = ClientInfo(
        client_id,
        arch,
        tuple(int(c) for c in np.unique(shard.y_train)),
        len(shard.y_train),
        sample_shape,
        site=config.broker.site,
    )
    return algorithm.client(ctx, info, model, shard, config.train)


def round_rng(seed: int, info: ClientInfo, t: int) -> np.random.Generator:
    """The generator of a client's round-``t`` training (batch order)."""
    return np.random.default_rng([seed, info.num_samples, t, client_number(info.client_id)])
