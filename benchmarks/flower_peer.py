"""The Flower side of the peer benchmark: a gRPC server and clients doing mqttfl's FedAvg job.

Runs in the benchmark venv (Flower installed, see benchmarks/requirements.txt), one OS
process per role, on 127.0.0.1. The clients train exactly what an mqttfl FedAvg client
trains: the shard from ``load_client_shard``, the model from ``build_model`` seeded like
``ClientRunner``, the same SGD optimizer and ``train_epochs`` with the same per-round
RNG seeds, the same float state entries as the exchanged weights, the sample count as
the FedAvg weight, and the same accuracy/F1/MAE on the local test split every round.
Flower's own idiom is used for the rest: ``start_server`` with its FedAvg strategy, and
an evaluate round after each fit round (which sends the global model to the clients).

    FLWR_TELEMETRY_ENABLED=0 .venv-bench/bin/python -m benchmarks.flower_peer server \
        --port 8080 --clients 6 --rounds 5 --out flower.json
    FLWR_TELEMETRY_ENABLED=0 .venv-bench/bin/python -m benchmarks.flower_peer client \
        --port 8080 --id 0 --config configs/fedapa-csi.toml --set method=fedavg
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # never phone home: loopback only

import argparse
import json
import time
from pathlib import Path
from typing import Any


def train_round(model: Any, optimizer: Any, shard: Any, config: Any, t: int, cid: int) -> float:
    """One round of an mqttfl FedAvg client's local training: cross-entropy over the
    shard with the per-round batch order of ``[seed, samples, round, client]``."""
    import numpy as np
    import torch

    from mqttfl.training.loops import train_epochs

    rng = np.random.default_rng([config.seed, len(shard.y_train), t, cid])
    return train_epochs(
        model,
        optimizer,
        shard.x_train,
        shard.y_train,
        lambda logits, z, y: torch.nn.functional.cross_entropy(logits, y),
        epochs=config.train.local_epochs,
        batch_size=config.train.batch_size,
        rng=rng,
    )


def serve(args: argparse.Namespace) -> int:
    import flwr
    from flwr.server import ServerConfig, start_server
    from flwr.server.strategy import FedAvg

    marks: list[dict[str, Any]] = []

    # flwr lives in .venv-bench only: to mypy (.venv) its classes are Any
    class TimedFedAvg(FedAvg):  # type: ignore[misc]
        def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            marks.append({"round": server_round, "fit_configured": time.time()})
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
            accuracies = [r.metrics.get("accuracy", 0.0) for _, r in results]
            marks.append(
                {
                    "round": server_round,
                    "evaluated": time.time(),
                    "mean_accuracy": sum(accuracies) / max(len(accuracies), 1),
                    "failures": len(failures),
                }
            )
            return super().aggregate_evaluate(server_round, results, failures)

    n = args.clients
    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_fit_clients=n,
        min_evaluate_clients=n,
        min_available_clients=n,
        on_fit_config_fn=lambda r: {"server_round": r},
    )
    began = time.time()
    start_server(
        server_address=f"127.0.0.1:{args.port}",
        config=ServerConfig(num_rounds=args.rounds),
        strategy=strategy,
    )
    Path(args.out).write_text(
        json.dumps({"flwr": flwr.__version__, "began": began, "ended": time.time(), "marks": marks})
        + "\n"
    )
    return 0


def client(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    from flwr.client import NumPyClient
    from flwr.compat.client.app import start_client

    from mqttfl.algorithms.common.weights import float_entries
    from mqttfl.config import load_config
    from mqttfl.data.sources import load_client_shard
    from mqttfl.models import build_model
    from mqttfl.training.loops import make_optimizer, predict_logits
    from mqttfl.training.metrics import classification_report

    config = load_config(args.config, args.overrides)
    torch.set_num_threads(config.train.torch_threads)
    cid = args.id
    shard = load_client_shard(
        config.data,
        cid,
        seed=config.seed,
        num_classes=config.model.num_classes,
        num_clients=config.federation.num_clients,
    )
    torch.manual_seed(config.seed)  # identical initial weights, as ClientRunner does
    sample_shape = tuple(int(n) for n in shard.x_train.shape[1:])
    model = build_model(
        config.model.arch_for(int(cid)),
        num_classes=config.model.num_classes,
        embed_dim=config.model.embed_dim,
        input_dim=sample_shape[0] if len(sample_shape) == 1 else None,
    )
    optimizer = make_optimizer(model, config.train)
    names = [name for name, _ in float_entries(model)]

    def get_weights() -> list[np.ndarray]:
        state = model.state_dict()
        return [state[name].detach().numpy().copy() for name in names]

    def set_weights(arrays: list[np.ndarray]) -> None:
        model.load_state_dict(
            {name: torch.from_numpy(np.array(a)) for name, a in zip(names, arrays, strict=True)},
            strict=False,
        )

    class PeerClient(NumPyClient):  # type: ignore[misc]  # flwr: Any to mypy, as above
        def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
            return get_weights()

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
            t = int(config.get("server_round", 1))
            if t > 1:  # round 1 starts from the common seeded initialization, as in mqttfl
                set_weights(parameters)
            loss = train_round(model, optimizer, shard, cfg, t, int(cid))
            return get_weights(), len(shard.y_train), {"train_loss": float(loss)}

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
            set_weights(parameters)
            report = classification_report(
                shard.y_test, predict_logits(model, shard.x_test).argmax(axis=1)
            )
            return 0.0, len(shard.y_test), report

    cfg = config
    start_client(
        server_address=f"127.0.0.1:{args.port}",
        client=PeerClient().to_client(),
        insecure=True,
        max_wait_time=120,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server")
    server.add_argument("--port", type=int, required=True)
    server.add_argument("--clients", type=int, required=True)
    server.add_argument("--rounds", type=int, required=True)
    server.add_argument("--out", required=True)
    server.set_defaults(func=serve)
    peer = sub.add_parser("client")
    peer.add_argument("--port", type=int, required=True)
    peer.add_argument("--id", required=True)
    peer.add_argument("--config", required=True)
    peer.add_argument("--set", dest="overrides", action="append", default=[])
    peer.set_defaults(func=client)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
