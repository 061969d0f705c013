"""The privacy accountant: ε spent by a client's uploads, from Google's dp-accounting.

Each upload is one Gaussian mechanism of noise multiplier z (:mod:`mqttfl.privacy.
mechanism`), so a client that uploaded u times has spent the ε of u self-composed
Gaussian mechanisms at the run's δ, by the Rényi-DP accountant (Mironov 2017; the
library's ``RdpAccountant``, the one Flower's ``RdpAccountant`` wraps).

**Why no amplification by sampling.** When ``federation.fraction`` < 1 the rounds sample
clients, and the sampling rate q would shrink ε if the sample were secret. It is not
from the adversary that matters here: the coordinator draws the sample and receives the
uploads, so it knows which rounds a client took part in. ε is therefore counted over the
rounds a client actually uploaded in (its participation), never over all rounds with q;
q only sets how many uploads a client plans for, ⌈q·T⌉, when the noise is solved for a
target ε.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mqttfl.config import MAX_NOISE
from mqttfl.errors import ConfigError
from mqttfl.wire.ids import client_order

if TYPE_CHECKING:
    import dp_accounting

    from mqttfl.config import RunConfig

#: the reason a client's ``offline`` status gives when its next upload would exceed its budget
BUDGET_EXHAUSTED = "privacy budget exhausted"

#: relative slack on the budget, so that the noise solved for ε spends exactly ε
_SLACK = 1e-6


@lru_cache(maxsize=1024)
def epsilon_spent(noise_multiplier: float, uploads: int, delta: float) -> float:
    """ε after ``uploads`` Gaussian mechanisms of multiplier z, at δ (0 before any)."""
    if uploads <= 0:
        return 0.0
    import dp_accounting  # imported when first needed: a run without DP never loads it
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), uploads)
    return float(accountant.get_epsilon(delta))


@lru_cache(maxsize=64)
def solve_noise(epsilon: float, uploads: int, delta: float) -> float:
    """The smallest z (to the library's tolerance) whose ``uploads`` compositions spend
    at most ε at δ."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    def event(z: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads)

    z = dp_accounting.calibrate_dp_mechanism(
        rdp_privacy_accountant.RdpAccountant,
        event,
        epsilon,
        delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
        tol=1e-4,
    )
    return float(z)


@dataclass(frozen=True)
class PrivacySettings:
    """The run's ``[privacy]`` resolved: what every upload uses and declares."""

    clip: float
    noise_multiplier: float
    delta: float
    epsilon: float | None  # the budget; None: uploads are counted, never refused
    count_threshold: float
    planned_uploads: int
    sampling_rate: float

    def spent(self, uploads: int) -> float:
        return epsilon_spent(self.noise_multiplier, uploads, self.delta)

    def would_exceed(self, uploads_so_far: int) -> bool:
        """Whether one more upload would take the client past its budget."""
        if self.epsilon is None:
            return False
        return self.spent(uploads_so_far + 1) > self.epsilon * (1 + _SLACK)

    def uploads_within_budget(self, most: int) -> int:
        """How many uploads the budget allows a client, counted up to ``most``."""
        count = 0
        while count < most and not self.would_exceed(count):
            count += 1
        return count

    def declaration(self) -> dict[str, float]:
        """What every upload declares, checked against the run's by the coordinator."""
        return {"dp_clip": self.clip, "dp_noise": self.noise_multiplier, "dp_delta": self.delta}


def privacy_settings(config: RunConfig) -> PrivacySettings | None:
    """The run's settings, or None when ``[privacy]`` is off. With ``epsilon`` and no
    ``noise_multiplier`` the noise is solved so that ⌈fraction · rounds⌉ uploads spend ε.
    ConfigError, with the figures, for a mechanism no upload can use: a budget that not
    one upload fits, or noise past :data:`~mqttfl.config.MAX_NOISE` (every upload noise)."""
    p = config.privacy
    if not p.enabled:
        return None
    assert p.clip is not None  # the config's validator requires them when enabled
    planned = max(1, math.ceil(config.federation.fraction * config.rounds))
    z = p.noise_multiplier
    if z is None:
        assert p.epsilon is not None
        z = solve_noise(p.epsilon, planned, p.delta)
        if z > MAX_NOISE:
            raise ConfigError(
                "privacy.epsilon",
                f"{p.epsilon:g} over {planned} planned uploads needs noise multiplier "
                f"{z:.6g}, above {MAX_NOISE:g}: every upload would be noise",
            )
    elif p.epsilon is not None and epsilon_spent(z, 1, p.delta) > p.epsilon * (1 + _SLACK):
        raise ConfigError(
            "privacy.noise_multiplier",
            f"one upload at noise multiplier {z:g} spends ε={epsilon_spent(z, 1, p.delta):.6g} "
            f"(δ={p.delta:g}), more than privacy.epsilon={p.epsilon:g}: no client could "
            f"upload even once",
        )
    return PrivacySettings(
        clip=p.clip,
        noise_multiplier=z,
        delta=p.delta,
        epsilon=p.epsilon,
        count_threshold=p.count_threshold,
        planned_uploads=planned,
        sampling_rate=config.federation.fraction,
    )


def privacy_summary(config: RunConfig, uploads: Mapping[str, int]) -> dict[str, Any]:
    """``{"privacy": ...}`` for summary.json: each client's ε over the uploads the
    coordinator accepted from it, at the run's δ (nothing when ``[privacy]`` is off)."""
    settings = privacy_settings(config)
    if settings is None:
        return {}
    ordered = sorted(uploads, key=client_order)
    return {
        "privacy": {
            "delta": settings.delta,
            "clip": settings.clip,
            "noise_multiplier": settings.noise_multiplier,
            "budget": settings.epsilon,
            "sampling_rate": settings.sampling_rate,
            "uploads": {c: int(uploads[c]) for c in ordered},
            "epsilon": {c: settings.spent(int(uploads[c])) for c in ordered},
        }
    }
