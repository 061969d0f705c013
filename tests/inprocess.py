"""The real round engine with in-process clients and a fake clock: no broker, no processes.

Every message crosses the real codec and the real readers of :mod:`mqttfl.wire.control`
(status, start, ack, upload, downlink, metrics), and the loop is the coordinator's own
:class:`~mqttfl.engine.rounds.RoundEngine`; only the transport is missing. Clients can be
made to misbehave: ``silent`` ones acknowledge but never upload (a straggler), ``ghosts``
announce themselves and never answer, ``dead`` ones left (their will fired).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from mqttfl.algorithms import get_algorithm
from mqttfl.algorithms.base import Algorithm, ClientSide, Context, ServerSide, Upload
from mqttfl.config import FederationConfig, RunConfig, TrainConfig
from mqttfl.data.shard import Shard
from mqttfl.engine.actions import Announce, Close, Finish
from mqttfl.engine.documents import RunSummary
from mqttfl.engine.rounds import RoundEngine
from mqttfl.engine.state import RunState
from mqttfl.errors import RejectedUpload
from mqttfl.models import build_model
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire import Message, PayloadSchema, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    read_ack,
    read_metrics,
    read_start,
    read_status,
)
from mqttfl.wire.downlinks import read_downlink
from mqttfl.wire.schemas import Body, ClientInfo

RUN = "r"
NUM_CLASSES = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def toy_shard(index: int, *, n: int = 32, window: int = 8, subcarriers: int = 6) -> Shard:
    """Separable toy CSI windows: the class shifts the mean level; client i lacks class i."""
    rng = np.random.default_rng([index, 99])
    classes = [c for c in range(NUM_CLASSES) if c != index % NUM_CLASSES]
    y = rng.choice(classes, size=n + 8).astype(np.int64)
    x = (rng.normal(size=(n + 8, window, subcarriers)) * 0.3 + y[:, None, None]).astype(np.float32)
    return Shard(x[:n], y[:n], x[n:], y[n:], {"source": "toy"})


class Federation:
    """Clients and coordinator engine of one method, driven to completion in-process."""

    def __init__(
        self,
        name: str,
        *,
        clients: int = 3,
        arch: str | list[str] = "middle",
        rounds: int = 2,
        embed_dim: int = 8,
        federation: dict[str, Any] | None = None,
        algorithm: Algorithm | None = None,
        state: RunState | None = None,
        privacy: PrivacySettings | None = None,
        **params: Any,
    ) -> None:
        self.algorithm = algorithm or get_algorithm(name)
        self.ctx = Context(
            num_classes=NUM_CLASSES,
            embed_dim=embed_dim,
            rounds=rounds,
            seed=0,
            params=self.algorithm.params(**params),
            privacy=privacy,
        )
        fed = {"num_clients": clients, "min_clients": 1, "round_timeout_s": 60.0}
        self.config = RunConfig(
            run_id=RUN,
            method=self.algorithm.name,
            rounds=rounds,
            federation=FederationConfig(**{**fed, **(federation or {})}),
        )
        self.clock = FakeClock()
        self.engine = RoundEngine(
            self.config, self.algorithm, self.ctx, clock=self.clock, state=state
        )
        self.server: ServerSide = self.engine.server
        self.clients: list[ClientSide] = []
        self.schemas: list[PayloadSchema] = []  # what each client's runner would check
        self.silent: set[str] = set()  # acknowledge, never upload
        self.ghosts: set[str] = set()  # announced, never answer anything
        self.dead: set[str] = set()
        self.uploads: list[Upload] = []  # accepted in the last round
        self.accuracy: list[float] = []
        self.announced: list[Announce] = []
        self.closed: list[Close] = []
        self.summary: RunSummary | None = None
        for i in range(clients):
            shard = toy_shard(i)
            kind = arch[i % len(arch)] if isinstance(arch, list) else arch
            torch.manual_seed(0)
            model = build_model(kind, num_classes=NUM_CLASSES, embed_dim=embed_dim)
            info = ClientInfo(
                str(i),
                kind,
                tuple(np.unique(shard.y_train).tolist()),
                len(shard.y_train),
                tuple(shard.x_train.shape[1:]),
            )
            self.clients.append(
                self.algorithm.client(self.ctx, info, model, shard, TrainConfig(batch_size=8))
            )
            self.schemas.append(self.algorithm.upload_schema(self.ctx, info))
            self.announce(info)

    # --- what crosses the wire ---------------------------------------------------------
    def announce(self, info: ClientInfo) -> None:
        raw = Online(info).encode(RUN)
        self.engine.on_status(read_status(raw, run_id=RUN, client=info.client_id))

    def leave(self, client: str) -> None:
        self.dead.add(client)
        raw = Offline(client, "connection lost").encode(RUN)
        self.engine.on_status(read_status(raw, run_id=RUN, client=client))

    def send_upload(self, t: int, client: str, body: Body) -> Upload | None:
        raw = encode(Message("upload", RUN, t, client, dict(body)))
        return self.engine.on_upload(t, client, raw)

    def _answer(self, announce: Announce) -> None:
        start = read_start(announce.start.encode(RUN), run_id=RUN, round=announce.start.round)
        t = start.round
        self.uploads = []
        for client, schema in zip(self.clients, self.schemas, strict=True):
            cid = client.info.client_id
            if cid not in start.selected or cid in self.ghosts | self.dead:
                continue
            ack = Ack(t, cid, start.announcement).encode(RUN)
            self.engine.on_ack(read_ack(ack, run_id=RUN, round=t, client=cid))
            if cid in self.silent or cid in start.uploaded:
                continue
            client.train(t, dict(start.params), np.random.default_rng([t, int(cid)]))
            body = client.make_upload(t)
            schema.validate(body)  # the runner refuses to publish anything else
            with contextlib.suppress(RejectedUpload):
                taken = self.send_upload(t, cid, body)
                self.uploads += [taken] if taken is not None else []

    def _deliver(self, close: Close) -> None:
        t = close.round
        broadcast = read_downlink(close.payloads.broadcast, run_id=RUN, round=t, client="all")
        correct = []
        trained = {u.client_id for u in self.uploads}
        idle_score = self.config.federation.evaluate == "every_round" or t >= self.config.rounds
        for client in self.clients:
            cid = client.info.client_id
            if cid in self.ghosts | self.dead:
                continue
            if cid not in trained and not idle_score:  # as the runner: applies, no metrics
                client.receive(t, dict(broadcast.body), None)
                continue
            personal = None
            if cid in close.payloads.personal:
                raw = close.payloads.personal[cid]
                personal = dict(read_downlink(raw, run_id=RUN, round=t, client=cid).body)
            client.check_downlink(dict(broadcast.body), None)
            client.check_downlink({}, personal)
            client.receive(t, dict(broadcast.body), personal)
            predicted = client.predict(client.shard.x_test)
            assert predicted.shape == client.shard.y_test.shape
            accuracy = float(np.mean(predicted == client.shard.y_test))
            correct.append(accuracy)
            values = {"accuracy": accuracy, "f1": accuracy, "mae": 0.0}
            raw = Metrics(t, cid, values).encode(RUN)
            self.engine.on_metrics(read_metrics(raw, run_id=RUN, round=t, client=cid))
        self.accuracy.append(float(np.mean(correct)) if correct else 0.0)

    # --- driving -----------------------------------------------------------------------
    def step(self) -> None:
        """One engine step; if it had nothing to do, move the clock to its next timer."""
        actions = self.engine.step()
        for action in actions:
            if isinstance(action, Announce):
                self.announced.append(action)
                self._answer(action)
            elif isinstance(action, Close):
                self.closed.append(action)
                self._deliver(action)
            elif isinstance(action, Finish):
                self.summary = action.summary
        if not actions and not self.engine.finished:
            wake = self.engine.wake_at()
            assert wake is not None
            self.clock.now = max(self.clock.now, wake)

    def round(self, t: int, *, max_steps: int = 1000) -> None:
        """Drive until round t has closed."""
        for _ in range(max_steps):
            if self.engine.state.round >= t:
                return
            self.step()
        raise AssertionError(f"round {t} did not close in {max_steps} steps")

    def run(self, *, max_steps: int = 10_000) -> Federation:
        for _ in range(max_steps):
            if self.engine.finished:
                return self
            self.step()
        raise AssertionError(f"the run did not finish in {max_steps} steps")
