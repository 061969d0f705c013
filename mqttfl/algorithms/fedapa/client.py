"""FedAPA's client: Algorithm 2. Eq. 4's class prototypes up; Eq. 12's loss, with L_g
against Q_i (Eq. 9) and L_c against the prototype sets P (Eq. 10), from what came down."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mqttfl.algorithms.base import ClientSide, Context
from mqttfl.algorithms.common.prototype_uploads import class_statistics, prototype_schema
from mqttfl.algorithms.fedapa.downlinks import Broadcast, Personal, check_downlink
from mqttfl.algorithms.fedapa.equations import prototype_contrast
from mqttfl.algorithms.fedapa.peer_sampling import dequantize_sets, rebuild_own_set
from mqttfl.logs import get_logger
from mqttfl.training.lazy import F, torch
from mqttfl.training.loops import embed_all
from mqttfl.wire.control import Number
from mqttfl.wire.schemas import Body, ClientInfo, PayloadSchema

if TYPE_CHECKING:
    from torch import Tensor


class FedAPAClient(ClientSide):
    supports_privacy = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.q: Tensor | None = None  # (C, d) personalized Q_i
        self.p: Tensor | None = None  # (N, C, d) padded P, or (k+2, C, d): P_i and S
        self.p_weights: Tensor | None = None  # (k+2,) their weights, with a sample
        self.available: Tensor | None = None  # (C,) bool
        self.sent: tuple[np.ndarray, np.ndarray] | None = None  # the last upload, for P_i

    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return prototype_schema(ctx)

    def loss(
        self, t: int, params: Mapping[str, Number], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        """Eq. 12: L = L_ce + λ_t (L_g(Q_i) + L_c(P))."""
        loss = F.cross_entropy(logits, y)
        lam = float(params.get("lambda", 0.0))
        if lam <= 0.0 or self.q is None or self.available is None:
            return loss
        tau = self.ctx.params.tau
        extra = prototype_contrast(embedding, self.q, y, self.available, tau)
        if self.p is not None:
            extra = extra + prototype_contrast(
                embedding, self.p, y, self.available, tau, self.p_weights
            )
        return loss + lam * extra

    def make_upload(self, t: int) -> Body:
        """Eq. 4 over the local training set with the freshly trained encoder; the
        per-class counts stay on the device. With [privacy] on, the clipped and noised
        class means of :func:`class_statistics` (mqttfl/privacy/mechanism.py)."""
        embeddings = embed_all(self.model, self.shard.x_train)
        classes, protos, _ = class_statistics(self, embeddings, self.shard.y_train)
        self.sent = (classes, protos)
        return self.declared({"classes": classes, "prototypes": protos})

    def check_downlink(self, broadcast: Body, personal: Body | None) -> None:
        check_downlink(broadcast, personal, classes=self.ctx.num_classes, dim=self.ctx.embed_dim)

    def receive(self, t: int, broadcast: Body, personal: Body | None) -> None:
        # check_downlink passed both: each field present has its shape and kind
        down, mine = cast("Broadcast", broadcast), cast("Personal | None", personal)
        if "available" not in down:
            return
        self.available = torch.from_numpy(down["available"].astype(bool))
        self.p, self.p_weights = None, None
        sets = down.get("prototypes")
        if "prototypes_int8" in down:
            sets = dequantize_sets(down["prototypes_int8"], down["prototypes_scale"])
        if "global" in down:
            self.q = torch.from_numpy(down["global"])
        elif mine is not None and "q" in mine:
            self.q = torch.from_numpy(mine["q"])
        if mine is not None and "set_weights" in mine:  # [P_i, *S, *extra], weighted
            self._receive_sample(t, sets, mine)
        elif sets is not None:
            self.p = torch.from_numpy(sets)

    def _receive_sample(self, t: int, sets: np.ndarray | None, personal: Personal) -> None:
        weights = personal["set_weights"]
        own = None
        if self.sent is not None and self.q is not None:
            own = rebuild_own_set(*self.sent, self.q.numpy(), personal["own_sums"])
        if own is None:  # a restart or a stale upload: this round's L_c is left out
            get_logger().warning(
                "downlink.inconsistent", round=t, reason="the own set is not the upload kept"
            )
            return
        extra = personal.get("extra", np.zeros((0, *own.shape), np.float32))
        if sets is not None and len(weights) == len(sets) + 1 + len(extra):
            self.p = torch.from_numpy(np.concatenate([own[None], sets, extra]))
            self.p_weights = torch.from_numpy(weights)
        else:
            get_logger().warning(
                "downlink.inconsistent", round=t, reason="sample weights do not fit S"
            )

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            name: value.numpy()
            for name, value in (
                ("q", self.q),
                ("p", self.p),
                ("p_weights", self.p_weights),
                ("available", self.available),
            )
            if value is not None
        } | ({"sent_classes": self.sent[0], "sent": self.sent[1]} if self.sent else {})

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        for name in ("q", "p", "p_weights", "available"):
            if name in state:
                setattr(self, name, torch.from_numpy(np.asarray(state[name])))
        if "sent" in state and "sent_classes" in state:
            self.sent = (np.asarray(state["sent_classes"]), np.asarray(state["sent"]))
