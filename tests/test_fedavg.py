"""FedAvg: sample-weighted averaging within architecture groups; weight vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mqttfl.algorithms.base import Upload
from mqttfl.algorithms.common.weights import (
    average_by_group,
    flatten_weights,
    load_weights,
    weighted_average,
)
from mqttfl.models import build_model
from mqttfl.wire.schemas import ClientInfo


def test_weighted_average_uses_the_counts() -> None:
    out = weighted_average([np.array([1.0, 1.0]), np.array([3.0, 5.0])], [1, 3])
    np.testing.assert_allclose(out, [2.5, 4.0])


def test_weighted_average_requires_one_positive_weight_per_vector() -> None:
    with pytest.raises(ValueError, match="one positive weight per vector"):
        weighted_average([np.ones(2), np.ones(2)], [1])


def test_groups_of_identical_architecture_average_separately() -> None:
    def up(cid: str, arch: str, value: float) -> Upload:
        return Upload(
            cid, ClientInfo(cid, arch, (0,), 1, (8, 8)), {"weights": np.full(3, value, np.float32)}
        )

    out = average_by_group(
        [up("0", "tiny", 1), up("1", "tiny", 3), up("2", "large", 10)],
        {"0": 3.0, "1": 1.0, "2": 7.0},
    )
    np.testing.assert_allclose(out["tiny"], 1.5)
    np.testing.assert_allclose(out["large"], 10)


def test_weights_round_trip_through_a_flat_vector() -> None:
    torch.manual_seed(0)
    a = build_model("middle", num_classes=5, embed_dim=16)
    torch.manual_seed(1)
    b = build_model("middle", num_classes=5, embed_dim=16)
    load_weights(b, flatten_weights(a))
    x = torch.randn(3, 12, 12)
    a.eval(), b.eval()
    torch.testing.assert_close(a(x)[0], b(x)[0])
