"""The cross-room study's pieces (benchmarks/bench_crossroom.py): its control federation
and the gains it reports."""

from __future__ import annotations

import pytest

from benchmarks.bench_crossroom import one_room, summarize
from mqttfl.config import load_config


def test_control_clients_all_live_in_one_room() -> None:
    config = load_config(
        "configs/fedapa-csi.toml",
        ["data.samples_per_client=20", "data.window=4", "data.device=esp32"],
    )
    shards = one_room(config)
    assert len(shards) == config.federation.num_clients
    assert {s.meta["room_index"] for s in shards.values()} == {0}
    assert len({s.meta["client_id"] for s in shards.values()}) == len(shards)  # own sessions


def test_gains_are_per_seed_differences_to_local() -> None:
    per_seed = [
        {
            "local": {"0": 0.5, "1": 0.7},
            "pooled": {"0": 0.6, "1": 0.6},
            "fedavg_ft": {"0": 0.5, "1": 0.9},
        },
        {
            "local": {"0": 0.4, "1": 0.6},
            "pooled": {"0": 0.6, "1": 0.8},
            "fedavg_ft": {"0": 0.3, "1": 0.5},
        },
    ]
    out = summarize(per_seed)
    assert out["local"]["seeds"] == pytest.approx([0.6, 0.5])
    assert out["pooled"]["gain_seeds"] == pytest.approx([0.0, 0.2])
    assert out["pooled"]["gain"] == pytest.approx(0.1)
    assert out["pooled"]["clients_gaining"] == [1, 2]
    assert out["fedavg_ft"]["gain_seeds"] == pytest.approx([0.1, -0.1])
    assert out["fedavg_ft"]["clients_gaining"] == [1, 0]


def test_an_absent_pooled_row_keeps_its_reason() -> None:
    per_seed = [{"local": {"0": 0.5}, "fedavg_ft": {"0": 0.6}, "pooled_absent": "shapes differ"}]
    out = summarize(per_seed)
    assert "pooled" not in out
    assert out["pooled_absent"] == "shapes differ"
    assert out["fedavg_ft"]["gain"] == pytest.approx(0.1)
