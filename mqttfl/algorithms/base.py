"""The algorithm seam: a method is a server side, a client side and its permitted payload.

The runtime owns the round loop and the transport; a method only says what to send
down, how to aggregate what came up, which local loss to train with, and exactly which
fields a client may upload (:meth:`Algorithm.upload_schema`). Methods import torch,
numpy and the wire's schema types, never the runtime.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from pydantic import BaseModel, ConfigDict

from mqttfl.errors import WireError
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.privacy.mechanism import noise_rng
from mqttfl.training.lazy import torch
from mqttfl.training.loops import make_optimizer, predict_logits, train_epochs
from mqttfl.wire.control import Number
from mqttfl.wire.schemas import Body, ClientInfo, FloatField, PayloadSchema

if TYPE_CHECKING:
    from torch import Tensor

if TYPE_CHECKING:
    from mqttfl.config import RunConfig, TrainConfig
    from mqttfl.data.shard import Shard
    from mqttfl.models import EmbeddingModel


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Context:
    """Run-wide facts both sides agree on."""

    num_classes: int
    embed_dim: int
    rounds: int
    seed: int
    params: Any  # the method's validated parameter model
    privacy: PrivacySettings | None = None  # [privacy] resolved; None: off


@dataclass(frozen=True)
class Upload:
    client_id: str
    info: ClientInfo
    body: Body  # already validated against the method's upload schema


@dataclass
class Downlinks:
    broadcast: Body = field(default_factory=dict)
    personal: dict[str, Body] = field(default_factory=dict)


class ServerSide(ABC):
    """Server half of a method: round parameters and aggregation.

    Buffered mode (:mod:`mqttfl.engine.buffered`) asks one more thing of a method, by
    family: a method whose upload is a set it aggregates (prototypes) ``keeps_latest``,
    so each client's newest set counts at every close while it is fresh, weighted by its
    staleness; a method whose upload is a model has each upload moved onto the current
    version once (:meth:`rebase`, from what :meth:`version` kept of the versions before).
    """

    #: buffered mode: each client's newest upload is aggregated again at every close
    keeps_latest: bool = False

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def round_params(self, t: int) -> dict[str, Number]:
        """Published in the round's start message (schedules live on the server)."""
        return {}

    def prepare(self, t: int, upload: Upload) -> None:
        """An upload of open round ``t`` passed the gate: a method may start its
        aggregation's work on it here, while the other uploads arrive (default: none)."""
        return None

    @abstractmethod
    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        """Round ``t``'s downlinks from its uploads. ``staleness``: buffered mode's weight
        s(τ) of each client's upload (None: synchronous rounds, every weight 1)."""

    def version(self, downlinks: Downlinks) -> dict[str, np.ndarray]:
        """Buffered mode: what to keep of a published version to :meth:`rebase` later
        uploads on (default: nothing)."""
        return {}

    def rebase(
        self,
        upload: Upload,
        s: float,
        base: dict[str, np.ndarray],
        now: dict[str, np.ndarray],
    ) -> Upload:
        """Buffered mode: ``upload``, trained from version ``base``, as it counts in the
        version after ``now`` with staleness weight ``s`` (default: as it is)."""
        return upload

    def state_dict(self) -> dict[str, object]:
        """What a coordinator's checkpoint keeps of this side (default: nothing)."""
        return {}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        return None


# Upload magnitude bounds, enforced by the schema at both ends. Weights of the shipped
# models stay within ±10 after training and prototypes (mean embeddings) within ±100;
# a value a hundred times beyond is divergence or forgery, and these bounds keep a sum of
# squares over 10^5 uploads of 10^6 values far inside float32 (3.4e38).
WEIGHT_BOUND = 1e4


class ClientSide(ABC):
    """Client half of a method: local objective, upload, use of downlinks.

    The default :meth:`train` runs SGD over the shard with :meth:`loss`; methods with a
    different local procedure override it.
    """

    value_bound: float = WEIGHT_BOUND  # the largest magnitude an upload may carry
    max_grad_norm: float | None = None  # clip each local step's gradient to this norm
    #: whether make_upload applies [privacy]'s mechanism (mqttfl/privacy/mechanism.py)
    supports_privacy: bool = False
    #: whether a broadcast replaces whatever the ones before it left (:meth:`receive`
    #: overwrites, keeps nothing of them): a client may then skip to the newest
    #: (:meth:`Algorithm.fetched_on_demand`)
    broadcast_supersedes: bool = False
    _noise: np.random.Generator | None = None

    def __init__(
        self,
        ctx: Context,
        info: ClientInfo,
        model: EmbeddingModel,
        shard: Shard,
        train: TrainConfig,
    ) -> None:
        self.ctx = ctx
        self.info = info
        self.model = model
        self.shard = shard
        self.train_config = train
        self.optimizer = make_optimizer(model, train)

    # --- training -------------------------------------------------------------
    def loss(
        self, t: int, params: Mapping[str, Number], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        return torch.nn.functional.cross_entropy(logits, y)

    def train(self, t: int, params: Mapping[str, Number], rng: np.random.Generator) -> float:
        return train_epochs(
            self.model,
            self.optimizer,
            self.shard.x_train,
            self.shard.y_train,
            lambda logits, z, y: self.loss(t, params, logits, z, y),
            epochs=self.train_config.local_epochs,
            batch_size=self.train_config.batch_size,
            rng=rng,
            max_grad_norm=self.max_grad_norm,
        )

    def noise(self) -> np.random.Generator:
        """The generator of this client's DP noise (OS entropy, never the run's seed)."""
        if self._noise is None:
            self._noise = noise_rng()
        return self._noise

    def declared(self, body: Body) -> Body:
        """``body`` with the run's privacy settings declared, when [privacy] is on."""
        if self.ctx.privacy is None:
            return body
        return {**body, **self.ctx.privacy.declaration()}

    @classmethod
    @abstractmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        """Exactly what this method's clients may upload; checked at both ends."""

    @abstractmethod
    def make_upload(self, t: int) -> Body:
        """The body to publish; it must validate against the method's upload schema."""

    def check_downlink(self, broadcast: Body, personal: Body | None) -> None:
        """Raise WireError unless what :meth:`receive` reads of a downlink has the shapes
        this client needs (the wire already checked that every number is finite and
        bounded). Called for the broadcast (``personal`` None) and for the personal body
        (``broadcast`` empty) as each arrives, before anything is applied."""
        return None

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        """Take in round t's downlinks (kept for the next round's training)."""
        return None

    # --- evaluation -------------------------------------------------------------
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class predictions of the personalized model (classifier head by default)."""
        return cast("np.ndarray", predict_logits(self.model, x).argmax(axis=1))

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """The model this client predicts with once round ``t``'s downlinks are applied, as
        one module mapping a batch of samples to class scores whose argmax is
        :meth:`predict`'s answer (``mqttfl export`` writes it as ONNX). The classifier
        head's logits by default."""
        from mqttfl.models.scoring import Logits

        return Logits(self.model)

    def extra_metrics(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Further metrics published beside accuracy/F1/MAE (e.g. a second inference)."""
        return {}

    def state_dict(self) -> dict[str, np.ndarray]:
        """What a device's state file keeps of this side: named arrays (default: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        return None


@dataclass(frozen=True)
class Algorithm:
    """A registered method."""

    name: str
    server: type[ServerSide]
    client: type[ClientSide]
    params: type[BaseModel] = NoParams
    summary: str = ""
    #: the one model this method can train (FedAli's ALP layers), or None for any
    required_model: str | None = None

    def upload_schema(self, ctx: Context, info: ClientInfo) -> PayloadSchema:
        schema = self.client.upload_schema(ctx, info)
        if ctx.privacy is not None:  # an upload declares the run's settings, exactly
            declared = {
                key: FloatField(value, value) for key, value in ctx.privacy.declaration().items()
            }
            schema = replace(schema, fields={**schema.fields, **declared})
        return replace(schema, value_bound=self.client.value_bound)

    def fetched_on_demand(self, config: RunConfig) -> bool:
        """Whether a client fetches a round's broadcast only when it uses it: the round
        before one it trains (the broker's retained copy), the round it trains and the run's
        last, which it scores. So in a simulation's rounds (``federation.evaluate =
        "when_trained"``) the clients that sit out receive nothing, as Flower's unsampled
        clients do not exist. Only where skipping a broadcast changes nothing
        (:attr:`ClientSide.broadcast_supersedes`) and a broadcast is retained whole (no
        ``broker.max_message_bytes``: chunks are never retained)."""
        return (
            self.client.broadcast_supersedes
            and config.federation.evaluate == "when_trained"
            and config.federation.mode == "rounds"
            and config.broker.max_message_bytes == 0
        )


def expect_array(
    body: Body, key: str, shape: tuple[int | None, ...], *, kind: str = "f"
) -> np.ndarray | None:
    """``body[key]`` if present: an array of ``shape`` (None: any length) whose dtype kind
    is in ``kind``; WireError otherwise. For :meth:`ClientSide.check_downlink`."""
    if key not in body:
        return None
    value = body[key]
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kind:
        raise WireError("type", f"downlink field '{key}' must be an array of kind {kind!r}")
    if value.ndim != len(shape) or any(
        w is not None and w != g for w, g in zip(shape, value.shape, strict=True)
    ):
        raise WireError(
            "shape", f"downlink field '{key}' has shape {value.shape}, expected {shape}"
        )
    return value


def expect_map(body: Body, key: str) -> Body:
    """``body[key]``: a map (empty where absent); WireError otherwise."""
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise WireError("type", f"downlink field '{key}' must be a map")
    return cast("Body", value)
