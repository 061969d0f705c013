"""Every run uses its method's schedule: FedSAP's curriculum (Eq. 7) ramps in the last rounds
of any run, and FedAPA's warm-up (Eq. 11) reaches λ_max in every shipped config."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttfl.algorithms import make_context
from mqttfl.algorithms.base import Context
from mqttfl.algorithms.fedapa import FedAPAServer
from mqttfl.algorithms.fedsap import FedSAPParams, FedSAPServer, curriculum_start
from mqttfl.config import load_config

CONFIGS = sorted(str(p) for p in Path("configs").glob("*.toml"))


def _fedsap(rounds: int, **params: object) -> FedSAPServer:
    return FedSAPServer(
        Context(num_classes=3, embed_dim=2, rounds=rounds, seed=0, params=FedSAPParams(**params))
    )


@pytest.mark.parametrize("rounds", range(4, 61))
@pytest.mark.parametrize("shape", ["linear", "cosine", "sigmoid", "step"])
def test_fedsap_lambda_is_positive_in_the_last_rounds_of_any_run(rounds: int, shape: str) -> None:
    server = _fedsap(rounds, sap_schedule=shape)
    lambdas = [server.round_params(t)["lambda"] for t in range(1, rounds + 1)]
    assert lambdas[-1] == pytest.approx(0.7)  # M at the last round
    assert lambdas[-2] > 0.0  # and the round before it
    if rounds >= 5:
        assert lambdas[0] == 0.0  # r_start ≥ 1: the first round is CE (+ proxy) only
    assert lambdas == sorted(lambdas)


@pytest.mark.parametrize(("rounds", "start"), [(4, 0), (10, 2), (20, 4), (30, 6), (100, 20)])
def test_fedsap_start_is_the_appendixs_fifth_of_the_run(rounds: int, start: int) -> None:
    assert curriculum_start(rounds, fraction=0.2) == start
    assert _fedsap(rounds).start_round == start


def test_fedsap_absolute_start_round_overrides_the_fraction() -> None:
    assert _fedsap(30, sap_start_round=20).start_round == 20
    assert _fedsap(30, sap_start_round=0).round_params(1)["lambda"] > 0.0
    assert _fedsap(20, sap_start_round=20).round_params(20)["lambda"] == 0.0  # the user's choice


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("method", ["fedapa", "fedsap"])
def test_every_shipped_config_reaches_its_schedules_maximum(config: str, method: str) -> None:
    run = load_config(config, [f"method={method}"])
    ctx = make_context(run)
    if method == "fedapa":
        server = FedAPAServer(ctx)
        assert server.warmup_rounds < run.rounds
        assert server.round_params(run.rounds)["lambda"] == pytest.approx(ctx.params.lambda_max)
    else:
        server_sap = FedSAPServer(ctx)
        assert server_sap.round_params(run.rounds)["lambda"] == pytest.approx(
            ctx.params.sap_lambda_max
        )
        assert server_sap.round_params(run.rounds - 1)["lambda"] > 0.0
