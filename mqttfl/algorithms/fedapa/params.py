"""FedAPA's ``[method]`` keys, and those of the two Table IV ablations."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FedAPAParams(BaseModel):
    """Defaults are the paper's: τ=0.5, λ from 0 to 1 over T_warm=50 rounds.

    Left unset, ``warmup_rounds`` is the paper's 50 capped at half the run
    (:func:`warmup_length`), so a run shorter than 100 rounds still reaches λ_max and
    spends its second half there; set it to pin T_warm.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    tau: float = Field(0.5, gt=0)
    lambda_min: float = Field(0.0, ge=0)
    lambda_max: float = Field(1.0, ge=0)
    warmup_rounds: int | None = Field(None, ge=1)
    aggregation: Literal["similarity", "mean"] = "similarity"
    use_client_prototypes: bool = True
    # k: above k+1 uploads, the broadcast carries k+1 sampled sets, not all N
    max_peer_sets: int = Field(8, ge=1)
    # How the sets are drawn above k+1 uploads: one per stratum of similar sets, for
    # `strata` strata, sent as int8 with per-class scales (low variance, see
    # mqttfl.algorithms.fedapa.peer_sampling; 40 keep a client's downlink under 300 KB at C=21,
    # d=256); or k+1 uniformly, as float32 (kept for comparison).
    sampling: Literal["strata", "uniform"] = "strata"
    strata: int = Field(40, ge=1)


class GlobalAvgParams(FedAPAParams):
    """Table IV, row 1: one global mean prototype per class, no L_c."""

    aggregation: Literal["similarity", "mean"] = "mean"
    use_client_prototypes: bool = False


class GlobalAvgClientProtosParams(FedAPAParams):
    """Table IV, row 2: one global mean prototype per class, with L_c."""

    aggregation: Literal["similarity", "mean"] = "mean"
