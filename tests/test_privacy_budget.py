"""[privacy] enforced by the coordinator and checked before the first round: the engine
holds each identity to its budget by its own count and ends a run that no client can
upload to any more (on the engine's clock); a privacy key set with privacy off, or a
mechanism no upload can use, is refused with the key and the figures."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mqttfl.config import load_config
from mqttfl.engine.actions import Phase
from mqttfl.engine.state import RunState
from mqttfl.errors import ConfigError, RejectedUpload
from mqttfl.privacy.accountant import (
    BUDGET_EXHAUSTED,
    PrivacySettings,
    epsilon_spent,
    privacy_settings,
)
from mqttfl.privacy.mechanism import clip_vector, noise_ratio, private_update
from mqttfl.wire.control import Metrics, Offline, read_metrics, read_status
from tests.helpers import mqttfl
from tests.inprocess import RUN, Federation

Z = 0.8


def two_uploads() -> PrivacySettings:
    """A budget that fits two uploads of noise multiplier Z, and not three."""
    return PrivacySettings(1.0, Z, 1e-5, epsilon_spent(Z, 2, 1e-5) * 1.0001, 3.0, 2, 1.0)


def test_the_coordinator_stops_selecting_a_spent_identity_and_ends_the_run() -> None:
    """The in-process devices never stop themselves: only the coordinator's count holds
    them. After two uploads each nobody can upload, and the run ends at once."""
    fed = Federation(
        "fedapa", clients=2, rounds=5, arch="tiny", privacy=two_uploads(), federation={}
    )
    closed = fed.clock.now
    fed.round(2)
    fed.run()
    assert fed.summary is not None
    assert fed.summary.rounds_completed == 2
    assert fed.summary.ended_early == "privacy budgets spent after round 2 of 5"
    assert fed.engine.state.uploads == Counter({"0": 2, "1": 2})
    assert [a.start.round for a in fed.announced] == [1, 2]
    assert fed.clock.now - closed < fed.config.federation.round_timeout_s
    assert fed.engine.state.retries == 0


def test_a_run_that_ends_early_waits_only_for_the_clients_that_score_its_last_round() -> None:
    """federation.evaluate = "when_trained": the idle clients of the last round send no
    metrics for it, so an early end waits only for those who uploaded in it."""
    federation = {"fraction": 0.5, "min_clients": 2, "evaluate": "when_trained"}
    fed = Federation(
        "fedavg", clients=4, rounds=10, arch="tiny", privacy=two_uploads(), federation=federation
    )
    fed.round(4)  # two uploads a round, two per client: every budget spent after round 4
    closed = fed.clock.now
    fed.run()
    assert fed.summary is not None
    assert fed.summary.ended_early == "privacy budgets spent after round 4 of 10"
    seen = fed.engine.metrics_seen[4]
    assert len(seen) == 2  # the two that trained in it
    assert fed.clock.now == closed  # not a second of final_metrics_timeout_s waited out


def test_a_resumed_coordinator_that_ends_early_waits_for_its_last_rounds_uploaders() -> None:
    """Who uploaded in the last closed round travels in the checkpoint: a coordinator
    restarted before their metrics of it arrived waits for those two, and no longer."""
    federation = {"fraction": 0.5, "min_clients": 2, "evaluate": "when_trained"}

    def coordinator(state: RunState | None = None) -> Federation:
        return Federation(
            "fedavg",
            clients=4,
            rounds=10,
            arch="tiny",
            privacy=two_uploads(),
            federation=federation,
            state=state,
        )

    fed = coordinator()
    fed.round(4)  # every budget spent after round 4
    uploaders = sorted(u.client_id for u in fed.uploads)
    saved = fed.engine.state.to_dict(fed.config)
    state = RunState.from_dict(saved, fed.config, source="checkpoint.msgpack")
    assert state.last_uploaders == uploaders
    resumed = coordinator(state)
    for _ in range(100):
        if resumed.engine.phase is Phase.FINAL:
            break
        resumed.step()
    assert resumed.engine.phase is Phase.FINAL
    at = resumed.clock.now
    for n, client in enumerate(uploaders):
        assert resumed.engine.step() == []  # still waiting for `client`'s metrics
        raw = Metrics(4, client, {"accuracy": 0.5, "f1": 0.5, "mae": 0.0}).encode(RUN)
        resumed.engine.on_metrics(read_metrics(raw, run_id=RUN, round=4, client=client))
        assert not resumed.engine.finished or n == len(uploaders) - 1
    resumed.run()
    assert resumed.summary is not None
    assert resumed.clock.now == at  # finished on the second report, no timeout waited out


def test_an_upload_past_the_coordinators_count_is_refused_over_budget() -> None:
    """A device that reset its own count (its state wiped) is refused by ours."""
    fed = Federation("fedapa", clients=2, rounds=3, arch="tiny", privacy=two_uploads())
    fed.silent.add("0")
    fed.step()  # round 1 opens; client 1 uploads, client 0 trains
    assert fed.engine.phase is Phase.OPEN
    fed.engine.state.uploads["0"] = 2  # counted before the device was reset
    client = fed.clients[0]
    client.train(1, {}, np.random.default_rng(0))
    with pytest.raises(RejectedUpload) as refused:
        fed.send_upload(1, "0", client.make_upload(1))
    assert refused.value.reason == "over_budget"
    assert fed.engine.state.rejections["over_budget"] == 1
    fed.round(1)  # the refusal ended the wait for it: no deadline
    assert fed.closed[0].log["uploads"] == 1


def test_a_resumed_coordinator_keeps_the_count_of_its_checkpoint() -> None:
    state = RunState(round=1, uploads=Counter({"0": 2, "1": 1}))
    fed = Federation("fedapa", clients=2, rounds=3, arch="tiny", privacy=two_uploads(), state=state)
    assert fed.engine.spent("0")
    assert not fed.engine.spent("1")
    assert "0" not in fed.engine.selectable()


def test_a_client_that_says_its_budget_is_spent_is_never_waited_for() -> None:
    """Its own count ran out before ours (its upload was lost): its 'offline' is enough,
    and with min_clients it leaves no round to run."""
    fed = Federation(
        "fedapa",
        clients=2,
        rounds=3,
        arch="tiny",
        privacy=two_uploads(),
        federation={"min_clients": 2},
    )
    fed.round(1)
    raw = Offline("1", BUDGET_EXHAUSTED).encode(RUN)
    fed.engine.on_status(read_status(raw, run_id=RUN, client="1"))
    at = fed.clock.now
    fed.run()
    assert fed.summary is not None
    last = fed.summary.rounds_completed
    assert last < 3
    assert fed.summary.ended_early == f"privacy budgets spent after round {last} of 3"
    assert fed.clock.now - at < fed.config.federation.round_timeout_s


# --- checked before the first round ----------------------------------------------------------
@pytest.mark.parametrize(
    "key", ["epsilon=8", "noise_multiplier=1.0", "clip=1.0", "delta=0.001", "count_threshold=2"]
)
def test_a_privacy_key_with_privacy_off_is_an_error_naming_it(key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, [f"privacy.{key}"])
    assert raised.value.key == f"privacy.{key.split('=')[0]}"
    assert "privacy.enabled is false" in str(raised.value)


def test_privacy_on_with_its_keys_is_accepted() -> None:
    config = load_config(None, ["privacy.enabled=true", "privacy.clip=1", "privacy.epsilon=8"])
    assert config.privacy.epsilon == 8


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_privacy_value_must_be_finite(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["privacy.enabled=true", "privacy.clip=1", f"privacy.epsilon={value}"])
    assert raised.value.key == "privacy.epsilon"
    assert "finite" in str(raised.value)


def test_a_budget_that_no_upload_fits_is_refused_with_its_figures() -> None:
    config = load_config(
        None,
        [
            "privacy.enabled=true",
            "privacy.clip=1",
            "privacy.epsilon=8",
            "privacy.noise_multiplier=1e-9",
        ],
    )
    with pytest.raises(ConfigError) as raised:
        privacy_settings(config)
    assert raised.value.key == "privacy.noise_multiplier"
    assert "no client could upload even once" in str(raised.value)


def test_a_budget_whose_noise_drowns_every_upload_is_refused_with_its_figures() -> None:
    config = load_config(
        None, ["rounds=5", "privacy.enabled=true", "privacy.clip=1", "privacy.epsilon=1e-6"]
    )
    with pytest.raises(ConfigError) as raised:
        privacy_settings(config)
    assert raised.value.key == "privacy.epsilon"
    solved = float(str(raised.value).split("noise multiplier ")[1].split(",")[0])
    assert solved > 1e4
    assert math.isfinite(solved)


def test_the_commands_refuse_a_privacy_key_with_privacy_off_in_one_line(tmp_path: Path) -> None:
    result = mqttfl(
        "coordinator",
        "--config",
        "configs/fedapa-csi.toml",
        "--set",
        "privacy.epsilon=8",
        "--broker",
        "mqtt://127.0.0.1:9",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "privacy.epsilon" in lines[0]
    assert "privacy.enabled is false" in lines[0]


# --- what the coordinator can check of a release ------------------------------------------------
def test_the_noise_ratio_tells_a_noised_update_from_a_bare_one() -> None:
    """DP-FedAvg's release moves θ_start by about z·S·√d; an update sent without its noise
    by at most S. The ratio separates them by orders of magnitude for any model size."""
    rng = np.random.default_rng(0)
    for d in (100, 10_000):
        start = rng.normal(size=d)
        trained = start + rng.normal(size=d) * 0.1
        for z in (0.3, 1.0):
            honest = private_update(trained, start, clip=1.0, noise_multiplier=z, rng=rng)
            bare = start + clip_vector(trained - start, 1.0)
            assert noise_ratio(honest, start, clip=1.0, z=z) == pytest.approx(1.0, abs=0.2)
            assert noise_ratio(bare, start, clip=1.0, z=z) <= 1.0 / (z * math.sqrt(d)) + 1e-6
