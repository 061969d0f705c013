"""FedPAM: a personalized adjustment matrix on the shared head ("FedPAM: Bridging Local
Divergence in Federated Learning via Personalized Adjustment Matrix").

The protocol is FedAvg's over θ (encoder) and W (classifier): clients upload their
weights and sample count, the server averages them weighted by sample count over the
clients that took part (Appendix A, Algorithm 1, line 7), within each group of identical
architecture. Each client also keeps P_k ∈ R^{d×d}, the identity at its first
participation (line 12), trained with θ and W but never uploaded. Its adjusted head is
W_k^adj = W·P_k (Eq. 3.1). The local loss is Eq. 3.4: CE on the unadjusted logits W·z
plus λ·L_pcl (Eq. 3.3), a contrastive loss pulling the normalized z_i to its adjusted
class anchor against the other anchors and the in-batch features of other labels.
Inference uses the adjusted head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mqttfl.algorithms.base import Algorithm
from mqttfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mqttfl.training.lazy import F, nn, no_grad, torch
from mqttfl.training.loops import batches
from mqttfl.wire.control import Number

if TYPE_CHECKING:
    from torch import Tensor


class FedPAMParams(BaseModel):
    """λ=30 is the paper's default (Table 6); the temperature τ is not stated there."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pam_lambda: float = Field(30.0, ge=0)
    pcl_tau: float = Field(0.5, gt=0)
    # The clients' SGD step, when FedPAM needs another than [train] lr: its λ-weighted
    # contrastive term diverges at steps plain cross-entropy takes (MNIST: lr 0.05).
    pam_lr: float | None = Field(None, gt=0)
    # Clip each local step's gradient to this ℓ2 norm (None: no clipping). Off by default:
    # on MNIST's validation split (seeds 0-2) clipping to 10 or 1 cost 9 and 79 points,
    # since with λ=30 most of the gradient is the contrastive term's and clipping starves CE.
    pam_max_grad_norm: float | None = Field(None, gt=0)


def adjusted_head(weight: Tensor, pam: Tensor) -> Tensor:
    """Eq. 3.1: W_k^adj = W·P_k, with W (C, d) and P_k (d, d)."""
    return weight @ pam


def personalized_contrastive_loss(z: Tensor, y: Tensor, anchors: Tensor, tau: float) -> Tensor:
    """Eq. 3.3 with s(a, b) = ãᵀb̃ on ℓ2-normalized features and anchors:

    -1/|B| Σ_i log e^{s(z_i, w_{y_i})/τ} / (Σ_c e^{s(z_i, w_c)/τ} + Σ_{j: y_j≠y_i} e^{s(z_i, z_j)/τ}).
    """
    zn = F.normalize(z, dim=1)
    wn = F.normalize(anchors, dim=1)
    to_anchors = zn @ wn.T / tau  # (B, C)
    to_batch = (zn @ zn.T / tau).masked_fill(y.view(-1, 1) == y.view(1, -1), float("-inf"))
    denominator = torch.logsumexp(torch.cat([to_anchors, to_batch], dim=1), dim=1)
    return (denominator - to_anchors.gather(1, y.view(-1, 1)).squeeze(1)).mean()


class FedPAMClient(FedAvgClient):
    """Uploads exactly FedAvg's payload (weights, num_samples); P_k stays here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pam = nn.Parameter(torch.eye(self.model.embed_dim))
        self.optimizer.add_param_group({"params": [self.pam]})
        if self.ctx.params.pam_lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.ctx.params.pam_lr
        self.max_grad_norm = self.ctx.params.pam_max_grad_norm

    def loss(
        self, t: int, params: Mapping[str, Number], logits: Tensor, embedding: Tensor, y: Tensor
    ) -> Tensor:
        """Eq. 3.4: CE(W·z, y) + λ·L_pcl(W·P_k, z, y)."""
        p: FedPAMParams = self.ctx.params
        loss = F.cross_entropy(logits, y)
        if p.pam_lambda <= 0:
            return loss
        anchors = adjusted_head(self.model.classifier.weight, self.pam)
        return loss + p.pam_lambda * personalized_contrastive_loss(embedding, y, anchors, p.pcl_tau)

    @no_grad
    def predict(self, x: np.ndarray) -> np.ndarray:
        """The adjusted head: argmax_c (W·P_k·z + b)_c."""
        self.model.eval()
        head = adjusted_head(self.model.classifier.weight, self.pam)
        parts = [
            (self.model.embed(xb) @ head.T + self.model.classifier.bias).argmax(dim=1)
            for xb, _ in batches(x, np.zeros(len(x)), 256, None)
        ]
        return torch.cat(parts).numpy() if parts else np.zeros(0, np.int64)

    def evaluation_model(self, t: int) -> nn.Module:
        """The adjusted head W·P_k over the encoder, as :meth:`predict` scores."""
        from mqttfl.models.scoring import AdjustedHead

        return AdjustedHead(self.model, self.pam)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"pam": self.pam.detach().numpy().copy()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        if "pam" in state:
            with torch.no_grad():
                self.pam.copy_(torch.from_numpy(np.asarray(state["pam"], np.float32)))


ALGORITHMS = (
    Algorithm(
        "fedpam",
        FedAvgServer,
        FedPAMClient,
        FedPAMParams,
        summary="FedAvg + local adjustment matrix on the head, PCL (FedPAM)",
    ),
)
