"""Recipe search mode: clients score on a held-out part of their training split."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mqttfl.config import load_config
from mqttfl.data.shard import Shard
from mqttfl.data.sources import load_client_shard, validation_shard
from mqttfl.data.synthetic import make_room_shard
from mqttfl.errors import ConfigError, DataError


def _rows(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in x}


def _shard(fraction: float, seed: int = 0, client: str = "2") -> Shard:
    config = load_config(
        None, ["data.samples_per_client=80", f"data.validation_fraction={fraction}"]
    )
    return load_client_shard(config.data, client, seed=seed, num_classes=21, num_clients=6)


def test_validation_comes_out_of_the_training_split_and_never_touches_test() -> None:
    plain = make_room_shard(2, seed=0, window=64, samples=80, num_classes=21, test_fraction=0.2)
    held = _shard(0.25)
    train, val = _rows(held.x_train), _rows(held.x_test)
    assert not train & val  # disjoint
    assert train | val == _rows(plain.x_train)  # together: exactly the training split
    assert not val & _rows(plain.x_test)  # nothing of the test split
    assert len(held.y_test) == pytest.approx(
        0.25 * len(plain.y_train), abs=len(held.classes_present)
    )
    assert held.meta["scored_on"] == "validation"
    # every class with two or more samples keeps at least one for training
    for label in np.unique(plain.y_train):
        if (plain.y_train == label).sum() >= 2:
            assert (held.y_train == label).any()


def test_the_split_is_seeded() -> None:
    a, b, c = _shard(0.2), _shard(0.2), _shard(0.2, seed=1)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert _rows(a.x_test) != _rows(c.x_test)
    assert _rows(_shard(0.2, client="3").x_test) != _rows(a.x_test)


def test_off_by_default() -> None:
    plain = make_room_shard(2, seed=0, window=64, samples=80, num_classes=21, test_fraction=0.2)
    np.testing.assert_array_equal(_shard(0.0).x_test, plain.x_test)


@pytest.mark.parametrize("value", ["1.0", "-0.1", "half"])
def test_a_bad_fraction_names_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("data.validation_fraction")):
        load_config(None, [f"data.validation_fraction={value}"])


def test_a_shard_too_small_to_split_says_so() -> None:
    plain = make_room_shard(2, seed=0, window=8, samples=10, num_classes=21, test_fraction=0.2)
    one_each = validation_shard(plain, 0.5, seed=0, client_id="2")  # works while classes repeat
    assert len(one_each.y_test) >= 1
    from mqttfl.data.shard import Shard

    single = Shard(plain.x_train[:1], plain.y_train[:1], plain.x_test, plain.y_test, {})
    with pytest.raises(DataError, match="client 2"):
        validation_shard(single, 0.5, seed=0, client_id="2")
