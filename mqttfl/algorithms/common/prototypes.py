"""Shared pieces of the class-prototype methods (FedProto, FedSAP).

The server keeps one global bank: per class, the mean of the prototypes of the clients
that observed it this round (FedSAP Eq. 2; FedProto's aggregation). The client uploads
its class prototypes (the :func:`~mqttfl.algorithms.fedapa.prototype_schema` payload:
classes and prototypes, never weights; per-class counts only when the server weights the
bank by them, :meth:`PrototypeClient.uploads_counts`), keeps the bank it receives, and
can classify either with its classifier head or by the nearest global prototype.

With ``[privacy]`` on, :meth:`PrototypeClient.class_statistics` replaces the exact class
means by the clipped, noised ones of
:func:`~mqttfl.privacy.mechanism.private_class_prototypes` (noisy counts, and only the
classes whose noisy count passes the threshold), and every upload declares the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mqttfl.algorithms.base import (
    ClientSide,
    Context,
    Downlinks,
    ServerSide,
    Upload,
    expect_array,
)
from mqttfl.algorithms.common.prototype_uploads import (
    PrototypeUpload,
    class_statistics,
    prototype_schema,
    stack_uploads,
    uploaded_prototypes,
)
from mqttfl.errors import WireError
from mqttfl.training.lazy import F, no_grad, torch
from mqttfl.training.loops import embed_all
from mqttfl.training.metrics import classification_report
from mqttfl.wire.schemas import Body, ClientInfo, PayloadSchema

if TYPE_CHECKING:
    from torch import Tensor

Inference = Literal["head", "prototype"]
#: "squared": ‖r(h) - p̄_y‖² as FedSAP's Eq. 5 writes it; "mse": the same divided by d,
#: torch's MSE as FedProto's reference code computes its regularizer
ProtoDistance = Literal["squared", "mse"]


def global_bank(
    protos: np.ndarray, mask: np.ndarray, counts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 2 of FedSAP: p̄_c = (1/|Q_c|) Σ_{q∈Q_c} p_{q,c}, Q_c the clients holding c.

    ``protos`` is (N, C, d), ``mask`` (N, C). With ``counts`` (N, C) the mean is weighted
    by each client's sample count of the class instead (Σ n_qc p_qc / Σ n_qc). Returns the
    bank (C, d) float32, zero where nobody holds the class, and ``available`` (C,) bool.
    """
    weights = (
        mask.astype(np.float64) if counts is None else np.where(mask, counts, 0).astype(np.float64)
    )
    total = weights.sum(axis=0)  # (C,)
    available = total > 0
    bank = np.einsum("nc,ncd->cd", weights, protos.astype(np.float64))
    bank /= np.maximum(total, 1e-12)[:, None]
    return bank.astype(np.float32), available


def stack_counts(uploads: list[Upload], num_classes: int) -> np.ndarray:
    counts = np.zeros((len(uploads), num_classes), np.int64)
    for row, upload in enumerate(uploads):
        body = uploaded_prototypes(upload)
        counts[row, body["classes"]] = body["counts"]
    return counts


def nearest_prototype(embeddings: Tensor, bank: Tensor, available: Tensor) -> Tensor:
    """FedProto inference: argmin_c ‖r(h) - p̄_c‖₂ over the available classes."""
    distances = torch.cdist(embeddings, bank)
    return distances.masked_fill(~available.view(1, -1), float("inf")).argmin(dim=1)


def prototype_mse(embedding: Tensor, bank: Tensor, y: Tensor, available: Tensor) -> Tensor:
    """FedProto's regularizer and FedSAP Eq. 5, as torch's MSE: the batch mean of
    ‖r(h_i) - p̄_{y_i}‖² / d over the samples whose class is in the bank."""
    keep = available[y]
    if not bool(keep.any()):
        return embedding.sum() * 0.0
    return F.mse_loss(embedding[keep], bank[y[keep]])


def prototype_squared_distance(
    embedding: Tensor, bank: Tensor, y: Tensor, available: Tensor
) -> Tensor:
    """FedSAP Eq. 5 as written: the batch mean of ‖r(h_i) - p̄_{y_i}‖₂² (summed over the d
    dimensions, so d times :func:`prototype_mse`), over the samples whose class is in the
    bank."""
    keep = available[y]
    if not bool(keep.any()):
        return embedding.sum() * 0.0
    return (embedding[keep] - bank[y[keep]]).pow(2).sum(dim=1).mean()


def prototype_distance(
    embedding: Tensor, bank: Tensor, y: Tensor, available: Tensor, form: ProtoDistance
) -> Tensor:
    """L_Proto in the chosen form: ``squared`` (Eq. 5) or ``mse`` (÷ d, FedProto's code)."""
    if form == "squared":
        return prototype_squared_distance(embedding, bank, y, available)
    return prototype_mse(embedding, bank, y, available)


class BankServer(ServerSide):
    """Broadcasts the global bank of Eq. 2 (unweighted mean over holders)."""

    count_weighted = False
    keeps_latest = True  # buffered mode: each client's newest prototype set

    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        protos, mask = stack_uploads(uploads, self.ctx.num_classes, self.ctx.embed_dim)
        counts = stack_counts(uploads, self.ctx.num_classes) if self.count_weighted else None
        if staleness:  # buffered mode: stale sets count s(τ) times as much
            stale = np.array([staleness.get(u.client_id, 1.0) for u in uploads])
            counts = (mask if counts is None else counts) * stale[:, None]
        bank, available = global_bank(protos, mask, counts)
        return Downlinks(broadcast={"prototypes": bank, "available": available.astype(np.uint8)})


class PrototypeClient(ClientSide):
    """Uploads class prototypes, keeps the global bank, predicts by head or prototype.

    ``labelled()`` is the data the prototypes and the supervised loss use (the whole
    training split unless a subclass holds part of it back as unlabelled).
    """

    supports_privacy = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bank: Tensor | None = None  # (C, d) global prototypes
        self.available: Tensor | None = None  # (C,) bool

    @classmethod
    def uploads_counts(cls, ctx: Context) -> bool:
        """Whether the server reads per-class sample counts (else they stay on the device)."""
        return False

    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return prototype_schema(ctx, counts=cls.uploads_counts(ctx))

    def labelled(self) -> tuple[np.ndarray, np.ndarray]:
        return self.shard.x_train, self.shard.y_train

    def upload_body(self, classes: np.ndarray, prototypes: np.ndarray, counts: np.ndarray) -> Body:
        body = PrototypeUpload(classes=classes, prototypes=prototypes)
        if self.uploads_counts(self.ctx):
            body["counts"] = counts
        return self.declared(body)

    def class_statistics(
        self, embeddings: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(classes, prototypes, counts): the exact class means (Eq. 4 of FedAPA, Eq. 1 of
        FedSAP), or with [privacy] on their clipped and noised estimates."""
        return class_statistics(self, embeddings, y)

    def make_upload(self, t: int) -> Body:
        """Eq. 1 (FedSAP) / FedProto: mean embedding per local class, after training."""
        x, y = self.labelled()
        return self.upload_body(*self.class_statistics(embed_all(self.model, x), y))

    def check_downlink(self, broadcast: Body, personal: Body | None) -> None:
        bank = expect_array(broadcast, "prototypes", (self.ctx.num_classes, self.ctx.embed_dim))
        available = expect_array(broadcast, "available", (self.ctx.num_classes,), kind="biu")
        if (bank is None) != (available is None):
            raise WireError("missing_field", "a bank comes with its 'available' mask")

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        bank = expect_array(broadcast, "prototypes", (self.ctx.num_classes, self.ctx.embed_dim))
        available = expect_array(broadcast, "available", (self.ctx.num_classes,), kind="biu")
        if bank is not None and available is not None:
            self.bank = torch.from_numpy(bank)
            self.available = torch.from_numpy(available.astype(bool))

    def has_bank(self) -> bool:
        return self.bank is not None and self.available is not None and bool(self.available.any())

    # --- inference --------------------------------------------------------------
    @no_grad
    def _both_predictions(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        z = torch.from_numpy(embed_all(self.model, x))
        head = self.model.classify(z).argmax(dim=1).numpy()
        if not self.has_bank():
            return head, None
        assert self.bank is not None
        assert self.available is not None
        return head, nearest_prototype(z, self.bank, self.available).numpy()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The classifier head, or the nearest global prototype (``inference``);
        before any bank has arrived, prototype inference falls back to the head."""
        head, proto = self._both_predictions(x)
        if self.ctx.params.inference == "prototype" and proto is not None:
            return proto
        return head

    def evaluation_model(self, t: int) -> torch.nn.Module:
        """The head's logits, or with ``inference = "prototype"`` (once a bank arrived)
        the negative distance to each global prototype."""
        if self.ctx.params.inference == "prototype" and self.has_bank():
            from mqttfl.models.scoring import NearestPrototype

            assert self.bank is not None
            assert self.available is not None
            return NearestPrototype(self.model, self.bank, self.available)
        return super().evaluation_model(t)

    def extra_metrics(self, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Both inference strategies (FedSAP Sec. 4.1): ``head_*`` and ``proto_*``."""
        head, proto = self._both_predictions(x)
        out = {f"head_{k}": v for k, v in classification_report(y, head).items()}
        if proto is not None:
            out.update({f"proto_{k}": v for k, v in classification_report(y, proto).items()})
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        if self.bank is None or self.available is None:
            return {}
        return {"bank": self.bank.numpy(), "available": self.available.numpy()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        if "bank" in state:
            self.bank = torch.from_numpy(np.asarray(state["bank"], np.float32))
            self.available = torch.from_numpy(np.asarray(state["available"]).astype(bool))
