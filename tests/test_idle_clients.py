"""``federation.evaluate = "when_trained"``: a client that was not selected scores nothing,
as a simulation evaluates only the clients it sampled; every client scores the last round,
so the final table has them all. With FedAvg (whose broadcast replaces the one before) a
client fetches a round's broadcast only when it uses it: the round before one it trains
(the broker's retained copy), the round it trains and the run's last; the coordinator
counts the bytes of exactly those. A round a client sat out is not written to its state
file at once (the next state it writes holds it), so an idle client writes nothing a
round; the run's last round is written by all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mqttfl.config import load_config
from mqttfl.errors import ConfigError
from tests.faults import read_events
from tests.helpers import FAST, mqttfl

CLIENTS = ["0", "1", "2", "3"]
ROUNDS = 4


def test_when_trained_is_refused_in_buffered_mode() -> None:
    with pytest.raises(ConfigError, match=r"federation\.evaluate") as info:
        load_config(
            "configs/fedapa-csi.toml",
            ["federation.mode=buffered", "federation.evaluate=when_trained"],
        )
    assert "\n" not in str(info.value)


def _run(out: Path, evaluate: str) -> tuple[dict[tuple[int, str], bool], dict[str, set[int]]]:
    """(round, client) -> the metrics' ``selected``, and each client's rounds uploaded."""
    sets = [
        *FAST,
        "method=fedavg",
        f"rounds={ROUNDS}",
        f"federation.num_clients={len(CLIENTS)}",
        "federation.fraction=0.5",
        "federation.min_clients=2",
        f"federation.evaluate={evaluate}",
        "logging.level=debug",
    ]
    args = [arg for item in sets for arg in ("--set", item)]
    result = mqttfl(
        "run",
        "configs/fedapa-csi.toml",
        "--plain",
        "--no-local-reference",
        "--out",
        str(out),
        *args,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == ROUNDS
    lines = (out / "metrics.jsonl").read_text().splitlines()
    scored = {(r["round"], r["client_id"]): r["selected"] for r in map(json.loads, lines)}
    uploaded = {
        c: {
            e["round"]
            for e in read_events(out / "logs" / f"client-{c}.jsonl")
            if e["event"] == "upload.sent"
        }
        for c in CLIENTS
    }
    return scored, uploaded


@pytest.mark.slow
def test_an_idle_client_scores_only_the_rounds_it_trained_in_and_the_last(
    tmp_path: Path,
) -> None:
    scored, uploaded = _run(tmp_path / "when-trained", "when_trained")
    trained = {(t, c) for c, rounds in uploaded.items() for t in rounds}
    assert len(trained) == ROUNDS * 2  # half of four clients each round
    last = {(ROUNDS, c) for c in CLIENTS}
    assert set(scored) == {p for p in trained if p[0] < ROUNDS} | last
    assert all(scored[p] for p in trained)  # what it scored it had trained
    assert any(not scored[p] for p in last)  # the last round: the idle ones too
    out = tmp_path / "when-trained"
    fetches = 0
    for c in CLIENTS:
        events = read_events(out / "logs" / f"client-{c}.jsonl")
        applied = {e["round"]: e["kept"] for e in events if e["event"] == "downlink.applied"}
        before = {t - 1 for t in uploaded[c] if t > 1} - uploaded[c] - {ROUNDS}
        # the broadcasts it applied unscored: the rounds before those it trained, no other
        assert applied == dict.fromkeys(before, False), (c, applied, uploaded[c])
        evaluated = {e["round"] for e in events if e["event"] == "round.evaluated"}
        assert evaluated == {t for t in uploaded[c] if t < ROUNDS} | {ROUNDS}, c
        fetches += len(applied) + len(evaluated)
        state = torch.load(out / "clients" / "fedapa-csi" / f"client-{c}.pt", weights_only=True)
        assert state["applied_round"] == ROUNDS, c  # written at the last round, idle or not
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    broadcast = {r["bytes_down"] for r in map(json.loads, lines)}
    assert len(broadcast) == 1  # FedAvg's broadcast, the same size every round
    assert summary["comm"]["down_bytes_total"] == fetches * broadcast.pop()

    everything, _ = _run(tmp_path / "every-round", "every_round")
    assert set(everything) == {(t, c) for t in range(1, ROUNDS + 1) for c in CLIENTS}
    summary = json.loads((tmp_path / "every-round" / "summary.json").read_text())
    lines = (tmp_path / "every-round" / "metrics.jsonl").read_text().splitlines()
    sizes = [json.loads(line)["bytes_down"] for line in lines]
    assert summary["comm"]["down_bytes_total"] == sum(sizes)  # every client, every round
