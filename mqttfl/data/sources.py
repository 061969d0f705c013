"""Which shard a client trains on, from the run config's ``[data]`` table.

Every data source is one :class:`DataSource` in :data:`SOURCES`: how it builds a
client's shard, which client ids it can serve, whether it records sessions and whether
its labels are counts. Adding a source is one entry here (and its name in
``DataConfig.source``, which ``tests/test_registries_data.py`` checks against this table).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mqttfl.config import DataConfig, RunConfig
from mqttfl.data.shard import Shard, load_shard
from mqttfl.errors import ConfigError, DataError
from mqttfl.wire.ids import is_numeric_id


@dataclass(frozen=True)
class ShardRequest:
    """What a source is asked for: one client's shard, with the run's seed and sizes."""

    data: DataConfig
    client_id: str
    seed: int
    num_classes: int
    num_clients: int

    @classmethod
    def of(cls, config: RunConfig, client_id: str) -> ShardRequest:
        """Read from the run config once, here, rather than by every caller on the way."""
        fed, model = config.federation, config.model
        return cls(config.data, client_id, config.seed, model.num_classes, fed.num_clients)


@dataclass(frozen=True)
class DataSource:
    """One value of ``data.source``."""

    name: str
    build: Callable[[ShardRequest], Shard]
    #: picks a client's data by its number (client 3 gets room, partition or chip 3);
    #: otherwise any id is taken (``shards``: a ``client-<id>/`` directory per client)
    numbered: bool = True
    #: why client number ``index`` gets no data, given (data, index, num_clients); None: fine
    index_problem: Callable[[DataConfig, int, int], str | None] | None = None
    #: records sessions, so that ``data.split = "session"`` can hold whole ones out
    has_sessions: bool = True
    #: whether the labels are counts (an MAE means something); None when unknown here
    ordinal: Callable[[DataConfig], bool | None] = lambda data: False
    #: checks, on the machine that runs every client, that each client's data is there
    check_local: Callable[[DataConfig, int], None] | None = None


def shared_data_root(data: DataConfig) -> Path:
    """``data.path``, else $MQTTFL_SHARED_DATA, else ../shared/data (beside the checkout)."""
    return Path(data.path or os.environ.get("MQTTFL_SHARED_DATA") or "../shared/data")


def client_index(client_id: str) -> int:
    if not is_numeric_id(client_id):
        raise ConfigError("client id", f"{client_id!r} must be a number for generated datasets")
    return int(client_id)


def data_source(name: str) -> DataSource:
    """The registered source ``name``; a ConfigError naming the choices otherwise."""
    source = SOURCES.get(name)
    if source is None:
        raise ConfigError(
            "data.source", f"unknown data source {name!r}; one of {', '.join(SOURCES)}"
        )
    return source


def client_id_problem(data: DataConfig, client_id: str, *, num_clients: int) -> str | None:
    """Why client ``client_id`` could get no data from ``data.source``, or None.

    Checked up front (``broker init --config``) so that a bad id fails at once rather
    than when that client starts.
    """
    source = data_source(data.source)
    if not source.numbered:
        return None
    if not is_numeric_id(client_id):
        return (
            f"client id {client_id!r} is not a number, and data.source {data.source!r} "
            "picks a client's data by its number (use ids 0, 1, ... or data.source 'shards')"
        )
    if source.index_problem is None:
        return None
    problem = source.index_problem(data, int(client_id), num_clients)
    return None if problem is None else f"client id {client_id!r}: {problem}"


def check_local_data(data: DataConfig, num_clients: int) -> None:
    """Refuse, before a local run starts, data that is not on this machine."""
    check = data_source(data.source).check_local
    if check is not None:
        check(data, num_clients)


def shard_directory(data: DataConfig, client_id: str) -> Path:
    """``data.path/client-<id>/`` of the 'shards' source; an error naming what is missing."""
    if not data.path:
        raise ConfigError(
            "data.path", "the 'shards' source needs a directory of client-<id>/ shards"
        )
    if not Path(data.path).is_dir():
        raise ConfigError("data.path", f"{data.path} is not a directory")
    directory = Path(data.path) / f"client-{client_id}"
    if not directory.is_dir():
        raise DataError(
            directory, "no shard for this client (expected client-<id>/ under data.path)"
        )
    return directory


def run_client_shard(config: RunConfig, client_id: str, shard_dir: Path | None = None) -> Shard:
    """The shard a run's config gives ``client_id`` (its seed, classes and clients)."""
    return client_shard(ShardRequest.of(config, client_id), shard_dir)


def load_client_shard(
    data: DataConfig,
    client_id: str,
    *,
    seed: int,
    num_classes: int,
    num_clients: int,
    shard_dir: Path | None = None,
) -> Shard:
    """:func:`client_shard`, for a caller that holds the pieces rather than a run config."""
    request = ShardRequest(data, client_id, seed, num_classes, num_clients)
    return client_shard(request, shard_dir)


def client_shard(request: ShardRequest, shard_dir: Path | None = None) -> Shard:
    """The client's local shard. ``shard_dir`` (``--data DIR``) overrides the config.
    With ``data.validation_fraction`` the test split is replaced by a held-out part of the
    training split (:func:`validation_shard`)."""
    data, client_id = request.data, request.client_id
    shard = _source_shard(request, shard_dir)
    if data.validation_fraction > 0:
        if data.split == "session" and shard.has_sessions:
            return session_validation_shard(shard, data.validation_fraction)
        return validation_shard(
            shard, data.validation_fraction, seed=request.seed, client_id=client_id
        )
    return shard


def session_validation_shard(shard: Shard, fraction: float) -> Shard:
    """The session split's validation: whole training sessions held out, as the test
    sessions are (:func:`mqttfl.data.sessions.split_by_session`); the test split is
    dropped unread."""
    from mqttfl.data.sessions import split_by_session

    assert shard.s_train is not None
    s, y = shard.s_train, shard.y_train
    # days recording every label (synthetic) hold out the latest; recordings, per label
    by_label = shard.meta.get("source") != "synthetic"
    train, held, sessions = split_by_session(s, y, fraction, by_label=by_label)
    if not sessions:
        raise DataError(
            f"client {shard.meta.get('client_id', '?')}",
            "too few training sessions to hold one out for validation",
        )
    names = shard.session_names
    meta = {
        **shard.meta,
        "validation_fraction": fraction,
        "scored_on": "validation",
        "validation_sessions": [names[i] if i < len(names) else str(i) for i in sessions],
    }
    return Shard(
        shard.x_train[train],
        y[train],
        shard.x_train[held],
        y[held],
        meta,
        s_train=s[train],
        s_test=s[held],
    )


def validation_shard(shard: Shard, fraction: float, *, seed: int, client_id: str) -> Shard:
    """Train on the rest of the training split and score on a stratified, seeded share of
    it: hyper-parameters are chosen on this, and the test split is dropped unread. Each
    class with at least two training samples gives round(fraction·n), at least one."""
    y = shard.y_train
    rng = np.random.default_rng([seed, 7, zlib.crc32(client_id.encode())])
    held: list[np.ndarray] = []
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        if len(rows) < 2:
            continue
        take = min(len(rows) - 1, max(1, round(fraction * len(rows))))
        held.append(rng.choice(rows, size=take, replace=False))
    if not held:
        raise DataError(
            f"client {client_id}", "too few training samples to hold out a validation split"
        )
    mask = np.zeros(len(y), bool)
    mask[np.concatenate(held)] = True
    meta = {**shard.meta, "validation_fraction": fraction, "scored_on": "validation"}
    return Shard(shard.x_train[~mask], y[~mask], shard.x_train[mask], y[mask], meta)


def _source_shard(request: ShardRequest, shard_dir: Path | None) -> Shard:
    data = request.data
    if shard_dir is not None:
        return _checked_split(load_shard(shard_dir), data, shard_dir)
    source = data_source(data.source)
    if data.split == "session" and not source.has_sessions:
        raise ConfigError(
            "data.split",
            f"'session' needs recording sessions, and data.source {data.source!r} has none "
            "(use 'window')",
        )
    return source.build(request)


def shard_split(shard: Shard) -> str:
    """How a shard's test windows were chosen: its meta's ``split.method``, where
    ``time`` (the last windows of each recording) counts as a window split."""
    split = shard.meta.get("split")
    method = split.get("method") if isinstance(split, dict) else None
    return "session" if method == "session" else "window"


def _checked_split(shard: Shard, data: DataConfig, where: Path) -> Shard:
    """A prepared shard was split when it was prepared: it must be split as the config
    says, or every table would name the wrong split."""
    split = shard_split(shard)
    if split != data.split:
        hint = "data prepare --split session --session ..." if data.split == "session" else ""
        raise DataError(
            where,
            f"this shard has a {split} split, but data.split is {data.split!r}"
            + (f" (prepare it with `{hint}`)" if hint else ""),
        )
    return shard


def labels_are_ordinal(data: DataConfig) -> bool | None:
    """Whether the source's labels are counts (an MAE means something); None when the
    shards cannot be read here."""
    return data_source(data.source).ordinal(data)


# --- the sources ------------------------------------------------------------------------


def _synthetic(request: ShardRequest) -> Shard:
    from mqttfl.data.synthetic import make_room_shard

    data = request.data
    return make_room_shard(
        client_index(request.client_id),
        seed=request.seed,
        window=data.window,
        samples=data.samples_per_client,
        num_classes=request.num_classes,
        test_fraction=data.test_fraction,
        device=data.device,
        split=data.split,
    )


def _shards(request: ShardRequest) -> Shard:
    directory = shard_directory(request.data, request.client_id)
    return _checked_split(load_shard(directory), request.data, directory)


def _shards_ordinal(data: DataConfig) -> bool | None:
    """Read from client 0's shard meta."""
    import json

    meta = Path(data.path) / "client-0" / "meta.json"
    try:
        value = json.loads(meta.read_text(encoding="utf-8")).get("ordinal")
    except (OSError, ValueError, AttributeError):
        return None
    return value is True


def _shards_present(data: DataConfig, num_clients: int) -> None:
    for index in range(num_clients):
        shard_directory(data, str(index))


def _espectre(request: ShardRequest) -> Shard:
    from mqttfl.data.espectre import espectre_shard
    from mqttfl.data.espectre_files import espectre_root

    data = request.data
    return espectre_shard(
        client_index(request.client_id),
        root=espectre_root(data.path),
        window=data.window,
        stride=data.stride,
        split=data.split,
    )


def _espectre_here(data: DataConfig, num_clients: int) -> None:
    """Obtain the recordings once, before a local run's clients each look for them."""
    from mqttfl.data.espectre_files import espectre_root

    espectre_root(data.path)


def _espectre_chip(data: DataConfig, index: int, num_clients: int) -> str | None:
    from mqttfl.data.espectre import ESPECTRE_CHIPS

    if index < len(ESPECTRE_CHIPS):
        return None
    return f"ESPectre has {len(ESPECTRE_CHIPS)} clients (0-{len(ESPECTRE_CHIPS) - 1})"


def _images(request: ShardRequest) -> Shard:
    from mqttfl.data.images import image_shard

    data = request.data
    return image_shard(
        data.source,
        client_index(request.client_id),
        num_clients=request.num_clients,
        partition=data.partition,
        seed=request.seed,
        **data.partition_params,
    )


def _image_part(data: DataConfig, index: int, num_clients: int) -> str | None:
    if index < num_clients:
        return None
    return (
        f"data.source {data.source!r} partitions the data into "
        f"federation.num_clients = {num_clients} parts, numbered 0-{num_clients - 1}"
    )


_SOURCES = (
    DataSource("synthetic", _synthetic, ordinal=lambda data: True),
    DataSource(
        "shards",
        _shards,
        numbered=False,
        ordinal=_shards_ordinal,
        check_local=_shards_present,
    ),
    DataSource("espectre", _espectre, index_problem=_espectre_chip, check_local=_espectre_here),
    DataSource("digits", _images, index_problem=_image_part, has_sessions=False),
    DataSource("mnist", _images, index_problem=_image_part, has_sessions=False),
)

#: ``data.source`` -> its entry
SOURCES: Mapping[str, DataSource] = {source.name: source for source in _SOURCES}
