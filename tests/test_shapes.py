"""A model that cannot take its shard's samples is refused before anything starts.

`mqttfl run`, `coordinator` and `client` each say so in one line (the model, the shape,
a model that fits); the coordinator refuses such an announcement; `compare` shows the
setting as absent, with the reason, instead of waiting out round deadlines.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.config import load_config
from mqttfl.engine.gate import UploadGate
from mqttfl.errors import WireError
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.sizes import shape_problem, takes_shape
from mqttfl.wire.schemas import ClientInfo
from tests.helpers import mqttfl
from tests.test_cli_errors import CONFIG, assert_one_line

WINDOW = "(24, "  # the synthetic windows of these tests (data.window=24)
SMALL = ["data.window=24", "data.samples_per_client=60", "federation.num_clients=2"]


@pytest.mark.parametrize(
    ("shape", "fit"),
    [
        ((24, 30), {"tiny", "middle", "large", "cnn", "transformer"}),
        ((1, 8, 8), {"tiny", "middle", "large", "cnn", "transformer"}),
        ((420,), {"mlp"}),
        ((2, 8, 8), set()),
    ],
)
def test_which_models_take_a_shape(shape: tuple[int, ...], fit: set[str]) -> None:
    assert {m for m in MODEL_NAMES if takes_shape(m, shape)} == fit
    for model in MODEL_NAMES:
        problem = shape_problem(model, shape)
        assert (problem is None) == (model in fit)
        if problem is not None:
            assert f"model {model!r}" in problem
            assert str(shape) in problem
            assert (
                f"a model that fits: '{sorted(fit, key=MODEL_NAMES.index)[0]}'"
                if fit
                else "no model"
            ) in problem


def _args(*extra: str) -> list[str]:
    return [f"--set={item}" for item in [*SMALL, *extra]]


@pytest.mark.parametrize("command", ["run", "coordinator", "client"])
def test_each_command_refuses_a_model_that_cannot_take_the_samples(
    tmp_path: Path, command: str
) -> None:
    where = {
        "run": [CONFIG, "--out", str(tmp_path / "run")],
        "coordinator": ["--config", CONFIG, "--out", str(tmp_path / "run")],
        "client": ["--config", CONFIG, "--id", "0", "--state-dir", str(tmp_path / "state")],
    }[command]
    broker = [] if command == "run" else ["--broker", "mqtt://127.0.0.1:1"]
    result = mqttfl(command, *where, *broker, *_args("model.name=mlp"), timeout=120)
    assert_one_line(
        result, "config key 'model.name'", "model 'mlp' takes feature vectors", WINDOW, "'tiny'"
    )


def test_the_coordinator_refuses_an_announcement_its_model_cannot_take() -> None:
    config = load_config(CONFIG, ["method=fedavg"])
    gate = UploadGate(get_algorithm("fedavg"), make_context(config), "r", 10**7, Counter())
    with pytest.raises(WireError, match=r"model 'tiny' takes windows .* \(420,\)") as info:
        gate.schema_for(ClientInfo("3", "tiny", (0, 1), 50, (420,)))
    assert info.value.reason == "client_info"
    gate.schema_for(ClientInfo("4", "mlp", (0, 1), 50, (420,)))  # the model that fits


@pytest.mark.slow
def test_compare_shows_a_setting_that_cannot_run_as_absent(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    result = mqttfl(
        "compare",
        CONFIG,
        "--methods",
        "fedavg",
        "--seeds",
        "0",
        "--settings",
        "data",
        "--no-pooled",
        "--out",
        str(out),
        *_args("model.name=mlp", "rounds=1"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    table = (out / "compare.md").read_text()
    assert "| fedavg | absent | absent | absent | absent |" in table
    assert "model 'mlp' takes feature vectors" in table
    assert WINDOW in table
    (run,) = json.loads((out / "compare.json").read_text())["runs"]
    assert "model 'mlp'" in run["absent"]
    assert run["error"] is None
