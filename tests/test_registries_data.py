"""The registries: data sources, capture formats, image datasets,
shard groupings and model specs each hold one entry per name, and the config accepts
exactly the names they hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from mqttfl.config import DataConfig
from mqttfl.data.capture import CAPTURE_FORMATS, FORMATS, load_capture, read_features
from mqttfl.data.sources import (
    SOURCES,
    check_local_data,
    client_id_problem,
    data_source,
    labels_are_ordinal,
    load_client_shard,
)
from mqttfl.errors import ConfigError, DataError
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.specs import MODEL_SPECS, sample_kind
from tests.helpers import REPO

# --- data sources ------------------------------------------------------------------------


def test_the_config_accepts_exactly_the_registered_sources() -> None:
    accepted = get_args(DataConfig.model_fields["source"].annotation)
    assert tuple(SOURCES) == accepted
    assert all(source.name == name for name, source in SOURCES.items())


def test_an_unknown_source_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown data source 'cifar'") as info:
        data_source("cifar")
    assert info.value.key == "data.source"
    assert all(name in str(info.value) for name in SOURCES)


@pytest.mark.parametrize(
    ("source", "client_id", "problem"),
    [
        ("synthetic", "0", None),
        ("synthetic", "17", None),
        ("synthetic", "alice", "is not a number"),
        ("shards", "alice", None),
        ("digits", "3", None),
        ("digits", "4", "partitions the data into federation.num_clients = 4 parts"),
        ("mnist", "bob", "is not a number"),
        ("espectre", "1", None),
        ("espectre", "99", "ESPectre has"),
    ],
)
def test_which_client_ids_a_source_serves(source: str, client_id: str, problem: str | None) -> None:
    found = client_id_problem(DataConfig(source=source), client_id, num_clients=4)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(f"client id {client_id!r}")
        assert problem in found


def test_only_counted_labels_are_ordinal(tmp_path: Path) -> None:
    assert labels_are_ordinal(DataConfig(source="synthetic")) is True
    for source in ("espectre", "digits", "mnist"):
        assert labels_are_ordinal(DataConfig(source=source)) is False
    assert labels_are_ordinal(DataConfig(source="shards", path=str(tmp_path))) is None


def test_a_local_run_checks_only_shards_are_present(tmp_path: Path) -> None:
    check_local_data(DataConfig(source="synthetic"), 3)
    with pytest.raises(DataError, match="no shard for this client"):
        check_local_data(DataConfig(source="shards", path=str(tmp_path)), 3)
    with pytest.raises(ConfigError, match="needs a directory"):
        check_local_data(DataConfig(source="shards"), 3)


@pytest.mark.parametrize("source", [name for name, s in SOURCES.items() if not s.has_sessions])
def test_a_session_split_needs_a_source_with_sessions(source: str) -> None:
    data = DataConfig(source=source, split="session")
    with pytest.raises(ConfigError, match="'session' needs recording sessions"):
        load_client_shard(data, "0", seed=0, num_classes=10, num_clients=2)


def test_the_synthetic_source_builds_the_client_s_room() -> None:
    data = DataConfig(window=8, samples_per_client=20)
    shard = load_client_shard(data, "1", seed=0, num_classes=3, num_clients=2)
    assert shard.x_train.shape[1] == 8
    assert shard.meta["client_id"] == 1


# --- capture formats and the other tables of mqttfl/data ---------------------------------


def test_every_capture_format_is_registered_once() -> None:
    assert FORMATS == ("intel5300", "atheros", "nexmon", "esp32", "npz", "csv")
    assert tuple(CAPTURE_FORMATS) == FORMATS
    assert all(spec.name == name for name, spec in CAPTURE_FORMATS.items())
    assert [n for n, s in CAPTURE_FORMATS.items() if s.features is not None] == ["npz", "csv"]


def test_an_unknown_capture_format_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown format 'pcapng'") as info:
        load_capture(tmp_path / "x", "pcapng")
    assert all(name in str(info.value) for name in FORMATS)
    with pytest.raises(DataError, match="feature vectors come from npz or csv files, not pcapng"):
        read_features(tmp_path / "x", "pcapng")


def test_the_image_datasets_and_groupings_are_tables() -> None:
    from mqttfl.data.images import DATASETS
    from mqttfl.data.shard_builder import GROUPINGS

    assert DATASETS == ("digits", "mnist")
    assert {n for n, s in SOURCES.items() if not s.has_sessions} == set(DATASETS)
    assert GROUPINGS == ("all", "file", "dir", "device")


# --- model specs -------------------------------------------------------------------------


def test_the_specs_import_without_torch() -> None:
    code = (
        "import sys, mqttfl.models.specs, mqttfl.models.sizes; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_one_spec_per_model_name() -> None:
    assert tuple(MODEL_SPECS) == MODEL_NAMES
    assert all(spec.name == name for name, spec in MODEL_SPECS.items())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_spec_is_what_torch_builds(name: str) -> None:
    from mqttfl.models import build_model

    spec = MODEL_SPECS[name]
    model = build_model(name, num_classes=5, embed_dim=16, input_dim=12)
    assert model.arch == name
    assert type(model).__name__ == spec.model_class.rpartition(":")[2]
    state = [v for v in model.state_dict().values() if v.is_floating_point()]
    assert spec.weight_count(num_classes=5, embed_dim=16, input_dim=12) == sum(
        v.numel() for v in state
    )
    assert {"window": 2, "vector": 1}[spec.takes] == model.sample_ndim
    shape = (12,) if spec.takes == "vector" else (8, 12)
    assert sample_kind(shape) == spec.takes
    alp = getattr(model, "alp_layers", None)
    assert spec.alp_widths == (tuple(layer.dim for layer in alp()) if alp else ())


def test_sample_kinds_by_rank() -> None:
    assert sample_kind((5,)) == "vector"
    assert sample_kind((4, 5)) == "window"
    assert sample_kind((1, 4, 5)) == "window"
    assert sample_kind((2, 4, 5)) is None
    assert sample_kind(()) is None
