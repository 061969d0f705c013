"""Does every client's model take its shard's samples? Checked before anything starts.

A model that cannot take the data's sample shape (a ConvNet4 on 420-feature vectors, an
MLP on CSI windows) would otherwise fail inside every client at every round start, and
the coordinator would wait out round after round. :func:`check_sample_shapes` loads one
shard per architecture in use (the first client that runs it) and names the model, the
shape and a model that fits, in one line.
"""

from __future__ import annotations

from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.data.sources import run_client_shard
from mqttfl.errors import ConfigError
from mqttfl.models.sizes import shape_problem


def shard_shape_problem(config: RunConfig, client_id: str, shard: Shard) -> str | None:
    """Why client ``client_id``'s model cannot take ``shard``'s samples (None if it can)."""
    arch = config.model.arch_of(client_id)
    problem = shape_problem(arch, tuple(int(n) for n in shard.x_train.shape[1:]))
    return None if problem is None else f"client {client_id}: {problem}"


def _key(config: RunConfig) -> str:
    return "model.per_client" if config.model.per_client else "model.name"


def check_shard_shape(config: RunConfig, client_id: str, shard: Shard) -> None:
    """ConfigError (naming ``model.name`` or ``model.per_client``) for a model that
    cannot take its shard."""
    problem = shard_shape_problem(config, client_id, shard)
    if problem is not None:
        raise ConfigError(_key(config), problem)


def sample_shape_problem(config: RunConfig) -> str | None:
    """The first client (of the run's ids 0..N-1) whose model cannot take its shard, with
    why; one shard is loaded per architecture in use."""
    seen: set[str] = set()
    for index in range(config.federation.num_clients):
        client = str(index)
        arch = config.model.arch_of(client)
        if arch in seen:
            continue
        seen.add(arch)
        shard = run_client_shard(config, client)
        problem = shard_shape_problem(config, client, shard)
        if problem is not None:
            return problem
    return None


def check_sample_shapes(config: RunConfig) -> None:
    """ConfigError naming the model key when a client's model cannot take its shard."""
    problem = sample_shape_problem(config)
    if problem is not None:
        raise ConfigError(_key(config), problem)
