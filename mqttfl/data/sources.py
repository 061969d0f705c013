"""Which shard a client trains on, from the run config's ``[data]`` table."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from mqttfl.config import DataConfig, RunConfig
from mqttfl.data.shard import Shard, load_shard
from mqttfl.errors import ConfigError, DataError
from mqttfl.wire.ids import is_numeric_id


def shared_data_root(data: DataConfig) -> Path:
    """``data.path``, else $MQTTFL_SHARED_DATA, else ../shared/data (beside the checkout)."""
    return Path(data.path or os.environ.get("MQTTFL_SHARED_DATA") or "../shared/data")


#: The sources that pick a client's data by its number (client 3 gets room, partition or
#: chip 3); only ``shards`` (a ``client-<id>/`` directory per client) takes any id.
NUMBERED_SOURCES = frozenset({"synthetic", "espectre", "digits", "mnist"})


def client_index(client_id: str) -> int:
    if not is_numeric_id(client_id):
        raise ConfigError("client id", f"{client_id!r} must be a number for generated datasets")
    return int(client_id)


def client_id_problem(data: DataConfig, client_id: str, *, num_clients: int) -> str | None:
    """Why client ``client_id`` could get no data from ``data.source``, or None.

    Checked up front (``broker init --config``) so that a bad id fails at once rather
    than when that client starts.
    """
    if data.source not in NUMBERED_SOURCES:
        return None
    if not is_numeric_id(client_id):
        return (
            f"client id {client_id!r} is not a number, and data.source {data.source!r} "
            "picks a client's data by its number (use ids 0, 1, ... or data.source 'shards')"
        )
    index = int(client_id)
    if data.source in ("digits", "mnist") and index >= num_clients:
        return (
            f"client id {client_id!r}: data.source {data.source!r} partitions the data into "
            f"federation.num_clients = {num_clients} parts, numbered 0-{num_clients - 1}"
        )
    if data.source == "espectre":
        from mqttfl.data.espectre import ESPECTRE_CHIPS

        if index >= len(ESPECTRE_CHIPS):
            return (
                f"client id {client_id!r}: ESPectre has {len(ESPECTRE_CHIPS)} clients "
                f"(0-{len(ESPECTRE_CHIPS) - 1})"
            )
    return None


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
    return load_client_shard(
        config.data,
        client_id,
        seed=config.seed,
        num_classes=config.model.num_classes,
        num_clients=config.federation.num_clients,
        shard_dir=shard_dir,
    )


def load_client_shard(
    data: DataConfig,
    client_id: str,
    *,
    seed: int,
    num_classes: int,
    num_clients: int,
    shard_dir: Path | None = None,
) -> Shard:
    """The client's local shard. ``shard_dir`` (``--data DIR``) overrides the config.
    With ``data.validation_fraction`` the test split is replaced by a held-out part of the
    training split (:func:`validation_shard`)."""
    shard = _source_shard(
        data,
        client_id,
        seed=seed,
        num_classes=num_classes,
        num_clients=num_clients,
        shard_dir=shard_dir,
    )
    if data.validation_fraction > 0:
        if data.split == "session" and shard.has_sessions:
            return session_validation_shard(shard, data.validation_fraction)
        return validation_shard(shard, data.validation_fraction, seed=seed, client_id=client_id)
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


def _source_shard(
    data: DataConfig,
    client_id: str,
    *,
    seed: int,
    num_classes: int,
    num_clients: int,
    shard_dir: Path | None,
) -> Shard:
    if shard_dir is not None:
        return _checked_split(load_shard(shard_dir), data, shard_dir)
    if data.split == "session" and data.source in ("digits", "mnist"):
        raise ConfigError(
            "data.split",
            f"'session' needs recording sessions, and data.source {data.source!r} has none "
            "(use 'window')",
        )
    if data.source == "synthetic":
        from mqttfl.data.synthetic import make_room_shard

        return make_room_shard(
            client_index(client_id),
            seed=seed,
            window=data.window,
            samples=data.samples_per_client,
            num_classes=num_classes,
            test_fraction=data.test_fraction,
            device=data.device,
            split=data.split,
        )
    if data.source == "shards":
        directory = shard_directory(data, client_id)
        return _checked_split(load_shard(directory), data, directory)
    if data.source == "espectre":
        from mqttfl.data.espectre import espectre_shard

        return espectre_shard(
            client_index(client_id),
            root=shared_data_root(data) / "espectre",
            window=data.window,
            stride=data.stride,
            split=data.split,
        )
    from mqttfl.data.images import image_shard

    return image_shard(
        data.source,
        client_index(client_id),
        num_clients=num_clients,
        partition=data.partition,
        seed=seed,
        **data.partition_params,
    )


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
    shards cannot be read here. Read from client 0's shard meta for ``shards``."""
    if data.source == "synthetic":
        return True
    if data.source != "shards":
        return False
    import json

    meta = Path(data.path) / "client-0" / "meta.json"
    try:
        value = json.loads(meta.read_text(encoding="utf-8")).get("ordinal")
    except (OSError, ValueError, AttributeError):
        return None
    return value is True
