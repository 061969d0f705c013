"""The Flower side of the simulation benchmark: mqttfl's FedAvg job in Flower's Simulation
Engine (``flwr.simulation.run_simulation``, Ray backend, its default resources).

Runs in the benchmark venv (benchmarks/requirements.txt). A ClientApp trains what an
mqttfl FedAvg client trains: the shard of ``load_client_shard`` for its partition id, the
model of ``build_model`` seeded as ``ClientRunner`` seeds it, ``make_optimizer`` and
``train_epochs`` with the per-round RNG of :mod:`benchmarks.flower_peer`, the float state
entries as the weights and the sample count as the FedAvg weight; it scores the global
model on its test split. Flower's FedAvg samples ``--per-round`` nodes to train and as
many to evaluate each round. A ClientApp is stateless between rounds (Flower's
simulation idiom), so a client's optimizer starts afresh each round.

    FLWR_TELEMETRY_ENABLED=0 .venv-bench/bin/python -m benchmarks.flower_simulation \\
        --config configs/fedapa-csi.toml --clients 100 --per-round 10 --rounds 5 \\
        --out flower.json --set method=fedavg
"""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # never phone home

import argparse
import json
import time
from pathlib import Path
from typing import Any


def simulate(args: argparse.Namespace) -> int:
    import flwr
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from benchmarks.flower_peer import train_round
    from mqttfl.algorithms.common.weights import float_entries
    from mqttfl.config import load_config
    from mqttfl.data.sources import load_client_shard
    from mqttfl.models import build_model
    from mqttfl.training.loops import make_optimizer, predict_logits
    from mqttfl.training.metrics import classification_report

    config = load_config(args.config, [*args.overrides, f"federation.num_clients={args.clients}"])
    shards: dict[int, Any] = {}  # loaded once per worker process and partition

    def shard_of(cid: int) -> Any:
        if cid not in shards:
            shards[cid] = load_client_shard(
                config.data,
                str(cid),
                seed=config.seed,
                num_classes=config.model.num_classes,
                num_clients=args.clients,
            )
        return shards[cid]

    def model_for(cid: int, sample_shape: tuple[int, ...]) -> Any:
        torch.set_num_threads(config.train.torch_threads)
        torch.manual_seed(config.seed)  # identical initial weights, as ClientRunner does
        return build_model(
            config.model.arch_for(cid),
            num_classes=config.model.num_classes,
            embed_dim=config.model.embed_dim,
            input_dim=sample_shape[0] if len(sample_shape) == 1 else None,
        )

    def weights(model: Any) -> list[np.ndarray]:
        return [v.detach().numpy().copy() for _, v in float_entries(model)]

    def load(model: Any, arrays: list[np.ndarray]) -> None:
        names = [name for name, _ in float_entries(model)]
        state = {n: torch.from_numpy(np.array(a)) for n, a in zip(names, arrays, strict=True)}
        model.load_state_dict(state, strict=False)

    client_app = ClientApp()

    @client_app.train()  # type: ignore[untyped-decorator]  # flwr: Any to mypy
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        shard = shard_of(cid)
        model = model_for(cid, tuple(int(n) for n in shard.x_train.shape[1:]))
        t = int(msg.content["config"]["server-round"])
        if t > 1:  # round 1 starts from the common seeded initialization, as in mqttfl
            load(model, msg.content["arrays"].to_numpy_ndarrays())
        loss = train_round(model, make_optimizer(model, config.train), shard, config, t, cid)
        metrics = {"num-examples": len(shard.y_train), "train_loss": float(loss)}
        content = RecordDict(
            {"arrays": ArrayRecord(weights(model)), "metrics": MetricRecord(metrics)}
        )
        return Message(content=content, reply_to=msg)

    @client_app.evaluate()  # type: ignore[untyped-decorator]
    def evaluate(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        shard = shard_of(cid)
        model = model_for(cid, tuple(int(n) for n in shard.x_train.shape[1:]))
        load(model, msg.content["arrays"].to_numpy_ndarrays())
        report = classification_report(
            shard.y_test, predict_logits(model, shard.x_test).argmax(axis=1)
        )
        metrics = {"num-examples": len(shard.y_test), "accuracy": float(report["accuracy"])}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    marks: list[dict[str, Any]] = []

    class TimedFedAvg(FedAvg):  # type: ignore[misc]
        def configure_train(self, server_round: int, *rest: Any) -> Any:
            marks.append({"round": server_round, "train_configured": time.time()})
            return super().configure_train(server_round, *rest)

        def aggregate_evaluate(self, server_round: int, replies: Any) -> Any:
            replies = list(replies)
            accuracies = [
                float(r.content["metrics"]["accuracy"]) for r in replies if r.has_content()
            ]
            marks.append(
                {
                    "round": server_round,
                    "evaluated": time.time(),
                    "mean_accuracy": sum(accuracies) / max(len(accuracies), 1),
                    "evaluations": len(accuracies),
                }
            )
            return super().aggregate_evaluate(server_round, replies)

    server_app = ServerApp()

    @server_app.main()  # type: ignore[untyped-decorator]
    def main(grid: Grid, context: Context) -> None:
        shard = shard_of(0)
        initial = weights(model_for(0, tuple(int(n) for n in shard.x_train.shape[1:])))
        share = args.per_round / args.clients
        strategy = TimedFedAvg(
            fraction_train=share,
            fraction_evaluate=share,
            min_train_nodes=args.per_round,
            min_evaluate_nodes=args.per_round,
            min_available_nodes=args.clients,
        )
        strategy.start(grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=args.rounds)

    began = time.time()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=args.clients)
    record = {"flwr": flwr.__version__, "began": began, "ended": time.time(), "marks": marks}
    Path(args.out).write_text(json.dumps(record) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--per-round", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    return simulate(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
