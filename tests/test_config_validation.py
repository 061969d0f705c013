"""Config validation that needs no torch: model names, the broker's connect timeout."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mqttfl.config import load_config
from mqttfl.errors import ConfigError
from mqttfl.models.names import MODEL_NAMES
from tests.helpers import REPO

CONFIG = REPO / "configs" / "fedapa-csi.toml"


def test_config_and_model_names_import_without_torch() -> None:
    code = (
        "import sys, mqttfl.config, mqttfl.models.names; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_names_are_the_registry_names() -> None:
    from mqttfl.models import MODEL_FACTORIES, build_model

    assert tuple(MODEL_FACTORIES) == MODEL_NAMES
    with pytest.raises(ValueError, match="unknown model 'bogus'"):
        build_model("bogus", num_classes=3)


def test_unknown_model_name_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ["model.name=bogus"])
    assert str(info.value) == (
        f"config key 'model.name': unknown model 'bogus'; known: {', '.join(MODEL_NAMES)}"
    )


def test_unknown_per_client_model_names_its_position() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ['model.per_client=["tiny", "huge", "large"]'])
    assert info.value.key == "model.per_client[1]"
    assert "unknown model 'huge'" in str(info.value)


def test_unknown_model_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQTTFL_MODEL__NAME", "nope")
    with pytest.raises(
        ConfigError, match=re.escape("config key 'model.name': unknown model 'nope'")
    ):
        load_config(CONFIG)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_registered_model_is_accepted(name: str) -> None:
    config = load_config(CONFIG, [f"model.name={name}", f'model.per_client=["{name}"]'])
    assert config.model.name == name
    assert config.model.arch_for(3) == name


def test_connect_timeout_defaults_to_ten_seconds_and_must_be_positive() -> None:
    assert load_config(CONFIG).broker.connect_timeout_s == 10.0
    assert load_config(CONFIG, ["broker.connect_timeout_s=2.5"]).broker.connect_timeout_s == 2.5
    with pytest.raises(ConfigError, match=re.escape("config key 'broker.connect_timeout_s'")):
        load_config(CONFIG, ["broker.connect_timeout_s=0"])


def test_min_clients_above_num_clients_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, ["federation.num_clients=3", "federation.min_clients=4"])
    assert info.value.key == "federation.min_clients"
