"""Differential privacy on uploads: the mechanisms' math on hand-computed
cases, the sensitivity they are calibrated to, the accountant (dp-accounting), the
``[privacy]`` table, and what a private upload declares and the schema enforces."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
import torch

from mqttfl.algorithms import get_algorithm, make_context
from mqttfl.algorithms.base import Algorithm, Context
from mqttfl.config import TrainConfig, load_config
from mqttfl.data.shard import Shard
from mqttfl.errors import ConfigError, WireError
from mqttfl.models import build_model
from mqttfl.privacy.accountant import (
    PrivacySettings,
    epsilon_spent,
    privacy_settings,
    privacy_summary,
    solve_noise,
)
from mqttfl.privacy.mechanism import (
    class_sums,
    clip_rows,
    private_class_prototypes,
    private_update,
)
from mqttfl.wire.schemas import ClientInfo


class Recorder:
    """A generator that records the scales asked of it and returns zeros (or ``value``)."""

    def __init__(self, value: float = 0.0) -> None:
        self.scales: list[float] = []
        self.value = value

    def normal(self, loc: float, scale: float, size: Any = None) -> np.ndarray | float:
        self.scales.append(scale)
        return float(self.value) if size is None else np.full(size, self.value)

    @property
    def rng(self) -> np.random.Generator:
        """This recorder where a generator is asked for (it has the one method used)."""
        return cast("np.random.Generator", self)


# --- the class-statistics mechanism ---------------------------------------------------
def test_clip_rows_scales_only_rows_longer_than_the_clip() -> None:
    clipped = clip_rows(np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]]), 1.0)
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])


def test_class_prototypes_are_clipped_sums_over_counts_by_hand() -> None:
    # windows: [3,4] -> [.6,.8] and [0,1] in class 0; [2,0] -> [1,0] in class 2; none in 1
    x = np.array([[3.0, 4.0], [0.0, 1.0], [2.0, 0.0]])
    classes, protos, counts = private_class_prototypes(
        x, np.array([0, 0, 2]), num_classes=3, clip=1.0, noise_multiplier=0.1, rng=Recorder().rng
    )
    np.testing.assert_array_equal(classes, [0, 2])  # class 1: noisy count 0 < floor
    np.testing.assert_allclose(protos, [[0.3, 0.9], [1.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(counts, [2, 1])


def test_noise_is_calibrated_to_the_sensitivity_sqrt2_c() -> None:
    rng = Recorder()
    z, c = 1.5, 2.0
    private_class_prototypes(
        np.ones((4, 3)),
        np.zeros(4, np.int64),
        num_classes=2,
        clip=c,
        noise_multiplier=z,
        rng=rng.rng,
    )
    # sums: sqrt(2)·z·C; counts: sqrt(2)·z (the vector (S, C·n) gets sqrt(2)·z·C throughout)
    assert rng.scales == pytest.approx([math.sqrt(2) * z * c, math.sqrt(2) * z])


@pytest.mark.parametrize("norm", [0.5, 1.0, 7.0])
def test_one_window_moves_the_released_vector_by_at_most_sqrt2_c(norm: float) -> None:
    """Δ₂ of v = (S, C·n) under adding one window: √(‖h̄‖² + C²) ≤ √2·C, equal when
    ‖h‖ ≥ C (the bound the noise is calibrated to)."""
    rng = np.random.default_rng(0)
    c, k = 1.0, 3
    x, y = rng.normal(size=(20, 4)), rng.integers(0, k, 20)
    extra = rng.normal(size=(1, 4))
    extra *= norm / np.linalg.norm(extra)

    def released(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        sums, counts = class_sums(clip_rows(x, c), y, k)
        return np.concatenate([sums.ravel(), c * counts])

    moved = np.linalg.norm(released(np.vstack([x, extra]), np.append(y, 1)) - released(x, y))
    assert moved == pytest.approx(math.sqrt(min(norm, c) ** 2 + c**2))
    assert moved <= math.sqrt(2) * c + 1e-12


def test_noise_on_sums_has_the_calibrated_spread() -> None:
    z, c = 2.0, 0.5
    rng = np.random.default_rng(3)
    draws = [
        private_class_prototypes(
            np.zeros((200, 8)),
            np.zeros(200, np.int64),
            num_classes=1,
            clip=c,
            noise_multiplier=z,
            rng=rng,
            count_threshold=0.0,
        )
        for _ in range(300)
    ]
    # p̃ = noise / ñ with ñ ≈ 200: its spread is sqrt(2)·z·C / 200 per coordinate
    spread = np.std(np.concatenate([p.ravel() for _, p, _ in draws]))
    assert spread == pytest.approx(math.sqrt(2) * z * c / 200, rel=0.1)


def test_absent_classes_rarely_pass_the_count_threshold() -> None:
    rng = np.random.default_rng(1)
    passed = [
        len(
            private_class_prototypes(
                np.ones((50, 2)),
                np.zeros(50, np.int64),
                num_classes=4,
                clip=1.0,
                noise_multiplier=1.0,
                rng=rng,
            )[0]
        )
        - 1
        for _ in range(400)
    ]
    # three absent classes, each past 3σ with probability Φ(-3) = 0.00135
    assert sum(passed) <= 6


# --- DP-FedAvg ----------------------------------------------------------------------------
def test_update_is_clipped_to_s_around_the_start_by_hand() -> None:
    start = np.array([1.0, 1.0], np.float32)
    out = private_update(
        start + np.array([3.0, 4.0], np.float32),
        start,
        clip=1.0,
        noise_multiplier=2.0,
        rng=Recorder().rng,
    )
    np.testing.assert_allclose(out, [1.6, 1.8], rtol=1e-6)
    small = private_update(
        start + np.array([0.3, 0.4], np.float32),
        start,
        clip=1.0,
        noise_multiplier=2.0,
        rng=Recorder().rng,
    )
    np.testing.assert_allclose(small, [1.3, 1.4], rtol=1e-6)


def test_update_noise_is_z_times_s() -> None:
    rng = Recorder()
    private_update(np.zeros(5), np.zeros(5), clip=0.7, noise_multiplier=3.0, rng=rng.rng)
    assert rng.scales == pytest.approx([2.1])


# --- the accountant -------------------------------------------------------------------------
def test_epsilon_grows_with_uploads_and_shrinks_with_noise() -> None:
    spent = [epsilon_spent(1.0, u, 1e-5) for u in (0, 1, 5, 20)]
    assert spent[0] == 0.0
    assert spent == sorted(spent)
    assert epsilon_spent(2.0, 5, 1e-5) < epsilon_spent(1.0, 5, 1e-5)


@pytest.mark.parametrize(("z", "uploads"), [(1.0, 1), (3.0, 15), (0.8, 40)])
def test_epsilon_is_within_the_classic_rdp_conversion(z: float, uploads: int) -> None:
    """T Gaussian mechanisms have RDP T·α/(2z²) (Mironov 2017, Prop. 7); the classic
    conversion ε = min_α T·α/(2z²) + log(1/δ)/(α-1) is an upper bound the library's
    tighter conversion must not exceed, and the RDP curve itself a lower one at α→1."""
    delta = 1e-5
    alphas = np.linspace(1.01, 512, 200_000)
    classic = float(np.min(uploads * alphas / (2 * z**2) + math.log(1 / delta) / (alphas - 1)))
    spent = epsilon_spent(z, uploads, delta)
    assert spent <= classic + 1e-6
    assert spent >= 0.7 * classic


def test_solved_noise_spends_the_target_over_the_planned_uploads() -> None:
    z = solve_noise(3.0, 15, 1e-5)
    assert epsilon_spent(z, 15, 1e-5) <= 3.0
    assert epsilon_spent(z, 15, 1e-5) == pytest.approx(3.0, rel=1e-3)
    assert epsilon_spent(z, 16, 1e-5) > 3.0


def test_budget_stops_exactly_after_the_planned_uploads() -> None:
    z = solve_noise(2.0, 4, 1e-5)
    settings = PrivacySettings(1.0, z, 1e-5, 2.0, 3.0, 4, 1.0)
    assert [settings.would_exceed(u) for u in range(6)] == [False] * 4 + [True] * 2
    assert not PrivacySettings(1.0, z, 1e-5, None, 3.0, 4, 1.0).would_exceed(100)


# --- the [privacy] table ---------------------------------------------------------------------
def test_privacy_is_off_by_default_and_changes_nothing() -> None:
    config = load_config(None, [])
    assert not config.privacy.enabled
    assert privacy_settings(config) is None
    assert make_context(config).privacy is None
    assert privacy_summary(config, {"0": 3}) == {}


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["privacy.enabled=true", "privacy.epsilon=3.0"], "privacy.clip"),
        (["privacy.enabled=true", "privacy.clip=1.0"], "privacy.epsilon"),
        (["privacy.clip=-1.0"], "privacy.clip"),
        (["privacy.delta=1.5"], "privacy.delta"),
        (["privacy.epsilon=0"], "privacy.epsilon"),
        (["privacy.sigma=1"], "privacy.sigma"),
    ],
)
def test_bad_privacy_tables_name_the_key(sets: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, sets)
    assert raised.value.key == key


@pytest.mark.parametrize("method", ["local"])
def test_a_method_without_a_private_upload_is_refused(method: str) -> None:
    config = load_config(
        None,
        [f"method={method}", "privacy.enabled=true", "privacy.clip=1.0", "privacy.epsilon=3.0"],
    )
    with pytest.raises(ConfigError) as raised:
        make_context(config)
    assert raised.value.key == "privacy.enabled"


def test_target_epsilon_solves_the_noise_for_the_planned_uploads() -> None:
    config = load_config(
        None,
        [
            "rounds=10",
            "federation.fraction=0.5",
            "privacy.enabled=true",
            "privacy.clip=1.0",
            "privacy.epsilon=4.0",
        ],
    )
    settings = privacy_settings(config)
    assert settings is not None
    assert settings.planned_uploads == 5  # ⌈0.5 · 10⌉
    assert settings.spent(5) == pytest.approx(4.0, rel=1e-3)
    summary = privacy_summary(config, {"1": 2, "0": 5})
    assert list(summary["privacy"]["epsilon"]) == ["0", "1"]
    assert summary["privacy"]["epsilon"]["0"] == pytest.approx(4.0, rel=1e-3)
    assert summary["privacy"]["epsilon"]["1"] < 4.0


# --- private uploads, declared and checked ---------------------------------------------------
INFO = ClientInfo("0", "tiny", (0, 1, 2), 12, (8, 6))


def _client(
    name: str, privacy: PrivacySettings | None
) -> tuple[Algorithm, Context, Any]:  # the client: the method's own class
    algorithm = get_algorithm(name)
    ctx = Context(3, 4, 2, 0, algorithm.params(), privacy)
    rng = np.random.default_rng(0)
    y = np.arange(16) % 3
    x = (rng.normal(size=(16, 8, 6)) + y[:, None, None]).astype(np.float32)
    torch.manual_seed(0)
    model = build_model("tiny", num_classes=3, embed_dim=4)
    client = algorithm.client(
        ctx, INFO, model, Shard(x[:12], y[:12], x[12:], y[12:], {}), TrainConfig(batch_size=4)
    )
    client.train(1, {"lambda": 0.0}, np.random.default_rng(1))
    return algorithm, ctx, client


SETTINGS = PrivacySettings(0.5, 0.05, 1e-5, None, 3.0, 2, 1.0)
TIGHT = PrivacySettings(0.1, 0.05, 1e-5, None, 3.0, 2, 1.0)  # below one round's update


@pytest.mark.parametrize(
    "name",
    ["fedapa", "fedapa-session", "fedproto", "fedsap", "fedavg", "wifed", "fedcaring", "fedpam"],
)
def test_private_uploads_declare_the_runs_settings_and_pass_its_schema(name: str) -> None:
    algorithm, ctx, client = _client(name, SETTINGS)
    body = client.make_upload(1)
    assert body["dp_clip"] == 0.5
    assert body["dp_noise"] == 0.05
    algorithm.upload_schema(ctx, INFO).validate(body)


def test_an_upload_declaring_other_settings_or_none_is_refused() -> None:
    algorithm, ctx, client = _client("fedapa", SETTINGS)
    schema = algorithm.upload_schema(ctx, INFO)
    body = client.make_upload(1)
    with pytest.raises(WireError) as raised:
        schema.validate({**body, "dp_noise": 0.01})
    assert raised.value.reason == "range"
    with pytest.raises(WireError) as raised:
        schema.validate({k: v for k, v in body.items() if not k.startswith("dp_")})
    assert raised.value.reason == "missing_field"
    # a run without DP refuses an upload that claims it
    plain = algorithm.upload_schema(Context(3, 4, 2, 0, algorithm.params()), INFO)
    with pytest.raises(WireError):
        plain.validate(body)


def test_private_prototypes_are_norm_bounded_and_near_the_clipped_means() -> None:
    _, _, client = _client("fedapa", SETTINGS)
    body = client.make_upload(1)
    assert np.linalg.norm(body["prototypes"], axis=1).max() <= 0.5 + 0.2
    _, _, plain = _client("fedapa", None)
    exact = plain.make_upload(1)
    assert "dp_clip" not in exact
    np.testing.assert_array_equal(body["classes"], exact["classes"])


def test_dp_fedavg_uploads_the_clipped_update_and_count_one() -> None:
    from mqttfl.algorithms.common.weights import flatten_weights

    _, _, client = _client("fedavg", TIGHT)
    client._noise = Recorder().rng  # noise 0: the release is θ_start + clip(Δ, S) exactly
    trained = np.linalg.norm(flatten_weights(client.model) - client.start)
    assert trained > 0.1  # one round moved the weights further than the clip
    body = client.make_upload(1)
    assert body["num_samples"] == 1
    assert np.linalg.norm(body["weights"] - client.start) == pytest.approx(0.1, rel=1e-3)


# --- ε where a user reads results: watch, the final table, report ------------------------------
def test_watch_shows_epsilon_from_the_uploads_it_saw() -> None:
    import io

    from rich.console import Console

    from mqttfl.monitor.view import FederationView, render
    from mqttfl.wire import Topics
    from mqttfl.wire.codec import Message, encode
    from mqttfl.wire.control import Online, RoundStart, RunStatus

    run, topics = "r1", Topics("r1")
    settings = PrivacySettings(1.0, 1.2, 1e-5, None, 3.0, 4, 1.0)
    view = FederationView(run, privacy=settings)
    for client in "01":
        info = ClientInfo(client, "tiny", (0, 1), 40, (24, 52))
        view.apply(topics.status(client), Online(info).encode(run), 1.0)
    body = {"prototypes": np.zeros((2, 4), np.float32)}
    for t in (1, 2):
        start = RoundStart(t, ("0", "1"), 60.0, {}, 1, (), 5)
        view.apply(topics.state, RunStatus("open", t, start).encode(run), t * 10.0)
        view.apply(topics.up(t, "0"), encode(Message("upload", run, t, "0", body)), t * 10.0 + 1)
    view.apply(topics.up(2, "0"), encode(Message("upload", run, 2, "0", body)), 22.0)  # again
    view.apply(topics.up(2, "1"), encode(Message("upload", run, 2, "1", body)), 23.0)
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render(view, 25.0))
    rows = {line.split()[1]: line for line in out.getvalue().splitlines() if line.startswith("│ ")}
    assert "ε" in out.getvalue()
    assert f"{epsilon_spent(1.2, 2, 1e-5):.2f}" in rows["0"]
    assert f"{epsilon_spent(1.2, 1, 1e-5):.2f}" in rows["1"]


def test_the_final_table_and_the_report_show_epsilon_per_client() -> None:
    from mqttfl.engine.documents import RunSummary
    from mqttfl.evaluation.report import privacy_lines
    from mqttfl.evaluation.table import format_table

    row = {"accuracy": 0.5, "f1": 0.4, "mae": 1.0, "kb_sent": 1.0, "kb_received": 2.0}
    summary = {
        "run_id": "r",
        "method": "fedapa",
        "split": "window",
        "ordinal_labels": False,
        "rounds_completed": 3,
        "clients": {"0": row, "1": row},
        "mean": row,
        "comm": {"up_bytes_per_client_round": 10.0, "down_bytes_per_client_round": 20.0},
    }
    assert "ε" not in format_table(RunSummary.model_validate(summary))  # [privacy] off
    assert privacy_lines(RunSummary.model_validate(summary).privacy) == []
    config = load_config(
        None, ["privacy.enabled=true", "privacy.clip=1.0", "privacy.noise_multiplier=2.0"]
    )
    summary.update(privacy_summary(config, {"0": 3, "1": 1}))
    private = RunSummary.model_validate(summary)
    table = format_table(private).splitlines()
    assert table[1].split()[-1] == "ε"
    assert float(table[2].split()[-1]) == pytest.approx(epsilon_spent(2.0, 3, 1e-5), abs=0.01)
    assert float(table[3].split()[-1]) == pytest.approx(epsilon_spent(2.0, 1, 1e-5), abs=0.01)
    report = privacy_lines(private.privacy)
    assert f"| 0 | 3 | {epsilon_spent(2.0, 3, 1e-5):.3f} |" in report


def test_the_coordinators_gate_rejects_an_upload_declaring_other_settings() -> None:
    from mqttfl.algorithms.fedapa import FedAPAParams
    from mqttfl.engine.gate import UploadGate
    from mqttfl.errors import RejectedUpload
    from mqttfl.wire import Message, encode

    ctx = Context(21, 8, 5, 0, FedAPAParams(), SETTINGS)
    gate = UploadGate(get_algorithm("fedapa"), ctx, "run", max_bytes=100_000)
    gate.open_round(3, ["1", "2"], keep=False)
    info = ClientInfo("1", "tiny", (0, 1), 40, (16, 16))
    body = {
        "classes": np.array([0, 1]),
        "prototypes": np.ones((2, 8), np.float32),
        **SETTINGS.declaration(),
    }

    def raw(sender: str, **changes: object) -> bytes:
        return encode(Message("upload", "run", 3, sender, {**body, **changes}))

    with pytest.raises(RejectedUpload) as raised:
        gate.check(3, "1", raw("1", dp_clip=2.0), info)
    assert raised.value.reason == "range"
    with pytest.raises(RejectedUpload) as raised:
        gate.check(3, "1", raw("1", dp_noise=SETTINGS.noise_multiplier / 2), info)
    assert raised.value.reason == "range"
    assert gate.rejections == {"range": 2}
    assert gate.check(3, "1", raw("1"), info).client_id == "1"  # the run's own settings


def test_a_private_client_announces_neither_its_classes_nor_its_sample_count() -> None:
    from mqttfl.nodes.client_privacy import announced

    info = ClientInfo("3", "tiny", (0, 4, 7), 321, (24, 52))
    hidden = announced(info, Context(21, 8, 5, 0, None, SETTINGS))
    assert (hidden.classes, hidden.num_samples) == ((), 0)
    assert (hidden.client_id, hidden.arch, hidden.sample_shape) == ("3", "tiny", (24, 52))
    assert announced(info, Context(21, 8, 5, 0, None)) is info  # [privacy] off: as before


def test_fedali_clips_its_weights_and_local_prototypes_as_one_update() -> None:
    from mqttfl.algorithms.fedali import local_key

    algorithm = get_algorithm("fedali")
    info = ClientInfo("0", "transformer", (0, 1, 2), 12, (8, 6))
    ctx = Context(3, 8, 2, 0, algorithm.params(), TIGHT)
    rng = np.random.default_rng(0)
    y = np.arange(16) % 3
    x = (rng.normal(size=(16, 8, 6)) + y[:, None, None]).astype(np.float32)
    torch.manual_seed(0)
    model = build_model("transformer", num_classes=3, embed_dim=8)
    client: Any = algorithm.client(
        ctx, info, model, Shard(x[:12], y[:12], x[12:], y[12:], {}), TrainConfig(batch_size=4)
    )
    client.train(1, {}, np.random.default_rng(1))
    client._noise = Recorder().rng  # noise 0: the release is the start + the clipped update
    body = client.make_upload(1)
    algorithm.upload_schema(ctx, info).validate(body)
    assert body["num_samples"] == 1
    update = np.concatenate(
        [body["weights"] - client.start]
        + [(body[local_key(i)] - start).ravel() for i, start in enumerate(client.local_start)]
    )
    # the weights' and the local prototypes' update, clipped together to C = 0.1
    assert np.linalg.norm(update) == pytest.approx(0.1, rel=1e-3)
