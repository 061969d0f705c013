"""Which shard a client trains on, from the run config's ``[data]`` table."""

from __future__ import annotations

import os
from pathlib import Path

from mqttfl.config import DataConfig
from mqttfl.data.shard import Shard, load_shard
from mqttfl.errors import ConfigError, DataError


def shared_data_root(data: DataConfig) -> Path:
    """``data.path``, else $MQTTFL_SHARED_DATA, else ../shared/data (beside the checkout)."""
    return Path(data.path or os.environ.get("MQTTFL_SHARED_DATA") or "../shared/data")


def client_index(client_id: str) -> int:
    if not client_id.isdigit():
        raise ConfigError("client id", f"{client_id!r} must be a number for generated datasets")
    return int(client_id)


def load_client_shard(
    data: DataConfig,
    client_id: str,
    *,
    seed: int,
    num_classes: int,
    num_clients: int,
    shard_dir: Path | None = None,
) -> Shard:
    """The client's local shard. ``shard_dir`` (``--data DIR``) overrides the config."""
    if shard_dir is not None:
        return load_shard(shard_dir)
    if data.source == "synthetic":
        from mqttfl.data.synthetic import make_room_shard

        return make_room_shard(
            client_index(client_id),
            seed=seed,
            window=data.window,
            samples=data.samples_per_client,
            num_classes=num_classes,
            test_fraction=data.test_fraction,
        )
    if data.source == "shards":
        if not data.path:
            raise ConfigError(
                "data.path", "the 'shards' source needs a directory of client-<id>/ shards"
            )
        directory = Path(data.path) / f"client-{client_id}"
        if not directory.is_dir():
            raise DataError(
                directory, "no shard for this client (expected client-<id>/ under data.path)"
            )
        return load_shard(directory)
    if data.source == "espectre":
        from mqttfl.data.espectre import espectre_shard

        return espectre_shard(
            client_index(client_id),
            root=shared_data_root(data) / "espectre",
            window=data.window,
            stride=data.stride,
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
