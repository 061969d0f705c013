"""A downlink's scoring can wait for the next training: the kept state is what is scored."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from mqttfl.algorithms.base import ClientSide
from mqttfl.nodes.client_eval import Evaluation
from tests.inprocess import Federation


async def _inline(func: Callable[..., Any], *args: Any) -> Any:
    return func(*args)


def test_a_kept_evaluation_scores_the_downlinks_model_and_puts_the_trained_one_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed = Federation("fedavg", clients=2, rounds=1).run()
    client: ClientSide = fed.clients[0]

    def weights() -> float:
        return float(sum(p.detach().double().sum() for p in client.model.parameters()))

    scored_with: list[float] = []
    predict = client.predict

    def spy(x: np.ndarray) -> np.ndarray:
        scored_with.append(weights())
        return predict(x)

    monkeypatch.setattr(client, "predict", spy)
    downlinks = weights()
    later = Evaluation(1, {"selected": True})
    later.keep(client.model, client)
    with torch.no_grad():  # "the next round's training" moves every weight
        for p in client.model.parameters():
            p.add_(1.0)
    trained = {k: v.clone() for k, v in client.model.state_dict().items()}
    report, _ = asyncio.run(later.scores(client.model, client, client.shard, _inline))
    assert scored_with == [downlinks]  # the kept (downlink's) model, not the trained one
    assert set(report) >= {"accuracy", "f1", "mae"}
    for name, value in client.model.state_dict().items():
        assert torch.equal(value, trained[name]), name  # the trained model is back
    asyncio.run(Evaluation(2, {}).scores(client.model, client, client.shard, _inline))
    assert scored_with[-1] == pytest.approx(weights())  # nothing kept: the model as it is


def test_a_kept_evaluation_keeps_the_methods_state_too() -> None:
    fed = Federation("fedapa", clients=2, rounds=2).run()
    client = fed.clients[0]
    state = client.state_dict()
    later = Evaluation(2, {})
    later.keep(client.model, client)
    assert later.kept is not None
    for name, value in state.items():
        np.testing.assert_array_equal(later.kept[1][name], value)
        assert later.kept[1][name] is not value  # a copy: training may change the original
