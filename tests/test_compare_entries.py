"""`mqttfl compare` entries pinned to a model (METHOD@MODEL) and the Adam option of
[train] they are compared with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mqttfl.config import TrainConfig, load_config
from mqttfl.engine.documents import CompareRow
from mqttfl.evaluation.compare_entries import method_name, pinned_model, run_overrides
from mqttfl.evaluation.compare_report import markdown_table
from mqttfl.models import build_model
from mqttfl.training import optimizers
from mqttfl.training.loops import make_optimizer


def test_a_pinned_entry_runs_its_method_on_its_model_in_every_setting() -> None:
    assert (method_name("fedavg@transformer"), pinned_model("fedavg@transformer")) == (
        "fedavg",
        "transformer",
    )
    assert pinned_model("fedali") == "transformer"
    assert pinned_model("fedavg") is None
    overrides = run_overrides(["rounds=2"], "model", "fedavg@transformer", 1)
    config = load_config("configs/fedapa-csi.toml", overrides)
    assert config.method == "fedavg"
    assert config.seed == 1
    assert config.model.name == "transformer"
    assert config.model.per_client == []
    plain = load_config("configs/fedapa-csi.toml", run_overrides([], "model", "fedavg", 0))
    assert plain.model.per_client == ["tiny", "middle", "large"]


def test_the_table_marks_a_pinned_entry() -> None:
    rows = [
        CompareRow.model_validate(
            {
                "method": m,
                "setting": "data",
                "runs": 1,
                **{k: {"mean": 0.5, "std": 0.0} for k in ("accuracy", "f1", "mae", "kb")},
            }
        )
        for m in ("fedavg", "fedavg@transformer")
    ]
    table = markdown_table(rows, ["fedavg", "fedavg@transformer"], ["data"], [0])
    assert "| fedavg@transformer * |" in table
    assert "| fedavg |" in table
    assert "fedavg@transformer runs model `transformer` in every setting" in table


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_train_optimizer(name: str) -> None:
    model = build_model("tiny", num_classes=3, embed_dim=8)
    train = TrainConfig(optimizer=name, lr=0.003, weight_decay=0.0)
    optimizer = make_optimizer(model, train)
    expected = optimizers.Adam if name == "adam" else optimizers.SGD
    assert type(optimizer) is expected
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.003)


def test_fedavg_on_fedali_trains_with_fedalis_recipe() -> None:
    from benchmarks.bench_accuracy import fedali_recipe

    recipe = fedali_recipe("configs/fedapa-csi.toml", ["rounds=4"])
    overrides = run_overrides(["rounds=4"], "data", "fedavg@transformer", 0) + recipe
    config = load_config("configs/fedapa-csi.toml", overrides)
    train = config.train
    assert (config.method, config.model.name) == ("fedavg", "transformer")
    assert (train.optimizer, train.lr, train.weight_decay) == ("adam", 3e-3, 0.0)  # local_lr
    assert (train.local_epochs, train.batch_size) == (5, 64)  # FedAli Sec. 5.1
    # each config's FedAli step is FedAvg's too (digits chose 3e-3 on validation); without
    # one it is the paper's Adam 1e-4
    digits = load_config(
        "configs/digits-fedsap.toml", fedali_recipe("configs/digits-fedsap.toml", [])
    )
    assert digits.train.lr == 3e-3
    paper = fedali_recipe("configs/digits-fedsap.toml", ["method.local_lr=1e-4"])
    assert "train.lr=0.0001" in paper


def test_a_finished_run_is_reused_whatever_other_methods_keys_the_config_gains(
    tmp_path: Path,
) -> None:
    """--resume: a step added for FedPAM changes no FedAPA run; FedAPA's own keys do."""
    from mqttfl.evaluation.compare_entries import finished_summary

    ran = load_config("configs/fedapa-csi.toml", ["method=fedapa"])
    means = {"accuracy": 0.5, "f1": 0.5, "mae": 1.0}
    comm = {"up_bytes_per_client_round": 1.0, "down_bytes_per_client_round": 1.0}
    summary = {"run_id": "r", "method": "fedapa", "rounds_completed": 1, "clients": {}}
    summary |= {"mean": means, "comm": comm, "config": ran.recorded()}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    # A key for another method comes with that method in the table's shared_with.
    shared = 'method.shared_with=["fedapa", "fedali", "fedpam", "fedsap"]'
    for other in ("method.pam_lr=0.05", "method.local_lr=0.1", "method.sap_lambda_max=0.5"):
        with_other = load_config("configs/fedapa-csi.toml", ["method=fedapa", shared, other])
        assert with_other.recorded() != ran.recorded()
        assert finished_summary(tmp_path, with_other) is not None, other
    own = load_config("configs/fedapa-csi.toml", ["method=fedapa", "method.tau=0.25"])
    assert finished_summary(tmp_path, own) is None
    assert finished_summary(tmp_path, ran.model_copy(update={"rounds": 3})) is None
