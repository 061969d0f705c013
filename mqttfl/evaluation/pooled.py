"""The pooled (centralized) reference: one model trained on the union of every client's
training split, scored on each client's own test split.

It answers what a federated table cannot on its own: how much any client could gain from
the other clients' data at all (FedAli's "Centralized" row, Sec. 5.1; the upper
reference beside Local's lower bound). To isolate that, everything but the data is a
Local client's: the same architecture and initial weights (``torch.manual_seed(seed)``
before building, as the client runner does), the same ``[train]`` recipe (optimizer,
learning rate, batch size) and the same number of epochs, ``rounds × local_epochs``,
each now over the pooled data. Scores are per client, so the row lines up with the
per-client means of the federated rows (a single final model, where those average the
last five rounds).

:func:`train_pooled` and :func:`pooled_reference` are pure: shards in, model and metrics
out; no broker, no files. Pooling needs one input shape and one architecture;
:func:`pooling_obstacle` says why a federation has no pooled row (e.g. rooms whose
devices report different subcarrier counts). :func:`run_pooled`, at the end, is
``mqttfl compare``'s wrapper: it loads the config's shards and keeps the result on disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mqttfl.training.lazy import F, torch
from mqttfl.training.loops import make_optimizer, predict_logits, train_epochs
from mqttfl.training.metrics import classification_report

if TYPE_CHECKING:
    from mqttfl.models import EmbeddingModel

if TYPE_CHECKING:
    from mqttfl.config import RunConfig, TrainConfig
    from mqttfl.data.shard import Shard

#: the batch-order stream of the pooled run (a client's streams are keyed by round)
POOLED_STREAM = 7_001


@dataclass(frozen=True)
class PooledReference:
    per_client: dict[str, dict[str, float]]  # client id -> accuracy, f1, mae on its test split
    epochs: int
    samples: int  # pooled training samples

    @property
    def mean(self) -> dict[str, float]:
        """Unweighted mean over clients, as the federated summaries average them."""
        keys = next(iter(self.per_client.values())).keys()
        return {k: float(np.mean([r[k] for r in self.per_client.values()])) for k in keys}


def pooling_obstacle(shards: Mapping[str, Shard], archs: Mapping[str, str]) -> str | None:
    """Why no single model can be trained on the union of these shards, or None."""
    shapes = {cid: tuple(int(n) for n in shard.x_train.shape[1:]) for cid, shard in shards.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"client {cid} {shape}" for cid, shape in shapes.items())
        return f"clients' samples differ in shape ({listed}), so their data cannot be pooled"
    if len(set(archs.values())) > 1:
        kinds = ", ".join(sorted(set(archs.values())))
        return f"clients run different architectures ({kinds}); a pooled model has one"
    return None


def pool_training_data(shards: Sequence[Shard]) -> tuple[np.ndarray, np.ndarray]:
    """The clients' training splits, concatenated in client order (test splits never)."""
    return (
        np.concatenate([s.x_train for s in shards]),
        np.concatenate([s.y_train for s in shards]),
    )


def train_pooled(
    x: np.ndarray,
    y: np.ndarray,
    *,
    arch: str,
    num_classes: int,
    embed_dim: int,
    train: TrainConfig,
    epochs: int,
    seed: int,
) -> EmbeddingModel:
    """One model of ``arch`` trained with cross-entropy on (x, y): ``make_optimizer(train)``,
    ``epochs`` shuffled passes in batches of ``train.batch_size``."""
    torch.manual_seed(seed)  # the clients' initial weights
    from mqttfl.models import build_model

    model = build_model(
        arch,
        num_classes=num_classes,
        embed_dim=embed_dim,
        input_dim=int(x.shape[1]) if x.ndim == 2 else None,
    )
    train_epochs(
        model,
        make_optimizer(model, train),
        x,
        y,
        lambda logits, z, labels: F.cross_entropy(logits, labels),
        epochs=epochs,
        batch_size=train.batch_size,
        rng=np.random.default_rng([seed, POOLED_STREAM]),
    )
    return model


def score_per_client(
    model: EmbeddingModel, shards: Mapping[str, Shard]
) -> dict[str, dict[str, float]]:
    return {
        cid: classification_report(shard.y_test, predict_logits(model, shard.x_test).argmax(axis=1))
        for cid, shard in shards.items()
    }


def pooled_reference(config: RunConfig, shards: Mapping[str, Shard]) -> PooledReference | str:
    """The pooled reference of a run config over its clients' shards, or the reason there
    is none (:func:`pooling_obstacle`)."""
    archs = {cid: config.model.arch_of(cid) for cid in shards}
    obstacle = pooling_obstacle(shards, archs)
    if obstacle is not None:
        return obstacle
    x, y = pool_training_data(list(shards.values()))
    epochs = config.rounds * config.train.local_epochs
    model = train_pooled(
        x,
        y,
        arch=next(iter(archs.values())),
        num_classes=config.model.num_classes,
        embed_dim=config.model.embed_dim,
        train=config.train,
        epochs=epochs,
        seed=config.seed,
    )
    return PooledReference(score_per_client(model, shards), epochs=epochs, samples=len(y))


# --- a reference run for `mqttfl compare`: load, train, score, keep ----------------------
@dataclass
class PooledRun:
    setting: str
    seed: int
    out: Path
    metrics: dict[str, float] = field(default_factory=dict)  # mean over clients
    per_client: dict[str, dict[str, float]] = field(default_factory=dict)
    absent: str | None = None  # why this federation has no pooled reference
    resumed: bool = False


def client_shards(config: Any) -> dict[str, Shard]:
    """Every client's shard, as the launcher's clients 0..N-1 load them."""
    from mqttfl.data.sources import load_client_shard

    return {
        str(i): load_client_shard(
            config.data,
            str(i),
            seed=config.seed,
            num_classes=config.model.num_classes,
            num_clients=config.federation.num_clients,
        )
        for i in range(config.federation.num_clients)
    }


def run_pooled(
    config_path: str, overrides: list[str], result: PooledRun, resume: bool = False
) -> PooledRun:
    """Train and score the pooled reference (or reuse ``pooled.json`` with --resume)."""
    from mqttfl.config import load_config

    config = load_config(config_path, overrides)
    dump = config.model_dump(mode="json")
    path = result.out / "pooled.json"
    if resume and path.exists():
        try:
            cached = json.loads(path.read_text())
        except ValueError:
            cached = {}
        if cached.get("config") == dump:
            result.metrics, result.per_client = cached["metrics"], cached["per_client"]
            result.absent, result.resumed = cached["absent"], True
            return result
    torch.set_num_threads(config.train.torch_threads)
    reference = pooled_reference(config, client_shards(config))
    record: dict[str, object] = {"config": dump}
    if isinstance(reference, PooledReference):
        result.metrics, result.per_client = reference.mean, reference.per_client
        record.update(epochs=reference.epochs, samples=reference.samples)
    else:
        result.absent = reference
    result.out.mkdir(parents=True, exist_ok=True)
    record.update(metrics=result.metrics, per_client=result.per_client, absent=result.absent)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return result
