"""The shift gate (mqttfl/adaptation/shift.py) and the layered adapted statistics
(mqttfl/training/normstats.py), on hand-computed cases, and FedAPA-S's use of them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from mqttfl.adaptation.moments import MomentSums
from mqttfl.adaptation.shift import (
    CALIBRATION_WINDOWS,
    ShiftGate,
    calibrate,
    fit_ratio,
    prototype_fit,
    shift_score,
)
from mqttfl.training.loops import predict_logits
from mqttfl.training.normstats import adapted_statistics, trained_statistics
from tests.inprocess import Federation


def _sums(x: np.ndarray) -> MomentSums:
    """The identity 'first layer': moments of the raw features (n, C)."""
    sums = MomentSums(x.shape[1])
    sums.add_values(x)
    return sums


def test_the_score_is_the_rms_standardized_shift_and_log_spread() -> None:
    # channel 0: shift 1 sd, same spread -> 1; channel 1: shift 2/2 sd = 1, sd x2 ->
    # 1 + (ln 2)^2; mean of the two, square root
    score = shift_score(
        np.array([1.0, 2.0]), np.array([1.0, 16.0]), np.zeros(2), np.array([1.0, 4.0])
    )
    assert score == pytest.approx(math.sqrt((1 + 1 + math.log(2) ** 2) / 2))
    assert shift_score(np.ones(3), np.ones(3), np.ones(3), np.ones(3)) == 0.0


def test_the_fit_is_the_mean_largest_cosine_to_an_available_prototype() -> None:
    protos = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    z = np.array([[2.0, 0.0], [1.0, 1.0]])
    # window 1: cos 1 to class 0; window 2: cos 1/sqrt(2) to classes 0 and 1
    assert prototype_fit(z, protos, np.array([True, True, False])) == pytest.approx(
        (1 + 1 / math.sqrt(2)) / 2
    )
    # class 0 unavailable: window 1's best is class 1 (cos 0), window 2's 1/sqrt(2)
    assert prototype_fit(z, protos, np.array([False, True, True])) == pytest.approx(
        1 / (2 * math.sqrt(2))
    )
    assert fit_ratio(0.45, 0.9) == pytest.approx(0.5)
    assert fit_ratio(0.3, 0.0) == math.inf


def _fits_by_day(table: dict[float, tuple[float, float]]) -> Any:
    """fits(x) looked up by the day's first value: (trained fit, adapted fit)."""
    return lambda x: table[float(x[0, 0])]


def test_leave_one_session_out_sets_the_threshold_at_the_worst_training_day() -> None:
    x = np.repeat(np.array([[0.0], [1.0], [2.0]], np.float32), 8, axis=0)
    sessions = np.repeat([0, 1, 2], 8)
    fits = _fits_by_day({0.0: (0.8, 0.8), 1.0: (0.9, 0.72), 2.0: (0.5, 0.9)})
    gate = calibrate(fits, (np.zeros(1), np.ones(1)), x, sessions)
    assert gate.calibration == "leave-one-session-out"
    assert gate.session_ratios == pytest.approx((1.0, 0.8, 1.8))
    assert gate.threshold == pytest.approx(0.8)
    assert gate.adapts(0.8)
    assert not gate.adapts(0.79)
    assert not gate.adapts(float("nan"))


def test_one_training_session_is_calibrated_on_its_halves_and_small_days_are_left_out() -> None:
    x = np.array([[0.0]] * 8 + [[1.0]] * 8, np.float32)
    fits = _fits_by_day({0.0: (1.0, 0.6), 1.0: (1.0, 0.9)})
    gate = calibrate(fits, (np.zeros(1), np.ones(1)), x, None)
    assert gate.calibration == "halves"
    assert gate.threshold == pytest.approx(0.6)
    small = calibrate(fits, (np.zeros(1), np.ones(1)), x[:6], np.zeros(6))
    assert small.calibration == "none"
    assert small.threshold == 1.0  # no day to learn from: adapt only where the fit holds


def test_a_long_training_day_is_fitted_on_a_bounded_evenly_spaced_sample() -> None:
    # day 0: 100 windows numbered 0..99; day 1: 8 windows, at the bound
    x = np.concatenate([np.arange(100.0), 1000.0 + np.arange(8.0)]).astype(np.float32)[:, None]
    sessions = np.repeat([0, 1], [100, 8])
    seen: list[np.ndarray] = []

    def fits(day: np.ndarray) -> tuple[float, float]:
        seen.append(day[:, 0].copy())
        return 1.0, 1.0

    calibrate(fits, (np.zeros(1), np.ones(1)), x, sessions, most=8)
    # 0..99 thinned to 8: the first, the last and six evenly between (99/7 apart, rounded)
    np.testing.assert_array_equal(seen[0], [0, 14, 28, 42, 57, 71, 85, 99])
    np.testing.assert_array_equal(seen[1], 1000.0 + np.arange(8.0))
    seen.clear()
    calibrate(fits, (np.zeros(1), np.ones(1)), x, sessions, most=None)
    assert [len(day) for day in seen] == [100, 8]
    seen.clear()
    calibrate(fits, (np.zeros(1), np.ones(1)), x, sessions)  # the default bound
    assert [len(day) for day in seen] == [CALIBRATION_WINDOWS, 8]


def test_the_shift_score_of_a_gate_is_against_the_training_moments() -> None:
    gate = ShiftGate(np.zeros(2), np.array([1.0, 4.0]), 1.0, "halves")
    assert gate.shift(np.array([1.0, 2.0]), np.array([1.0, 16.0])) == pytest.approx(
        math.sqrt((1 + 1 + math.log(2) ** 2) / 2)
    )


def test_a_gate_round_trips_and_a_bad_one_names_its_field() -> None:
    gate = ShiftGate(np.array([1.0, 2.0]), np.array([3.0, 4.0]), 0.5, "halves", (0.5,))
    again = ShiftGate.from_dict(gate.as_dict())
    assert again.threshold == 0.5
    assert again.session_ratios == (0.5,)
    np.testing.assert_array_equal(again.var, gate.var)
    with pytest.raises(ValueError, match=r"gate\.var"):
        ShiftGate.from_dict(gate.as_dict() | {"var": [1.0]})
    with pytest.raises(ValueError, match=r"gate\.threshold"):
        ShiftGate.from_dict(gate.as_dict() | {"threshold": "x"})
    with pytest.raises(ValueError, match=r"gate\.mean"):
        ShiftGate.from_dict(gate.as_dict() | {"mean": [float("nan"), 1.0]})
    with pytest.raises(ValueError, match=r"gate\.version"):
        ShiftGate.from_dict(gate.as_dict() | {"version": 99})


class _TwoNorms(nn.Module):
    """x -> BatchNorm1d -> 2x + 1 -> BatchNorm1d: the second layer's input depends on the
    first layer's statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.BatchNorm1d(1, eps=0.0)
        self.second = nn.BatchNorm1d(1, eps=0.0)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(2 * self.first(x) + 1)
        return out


def test_each_layer_is_measured_after_the_layers_before_it_are_adapted() -> None:
    model = _TwoNorms()
    with torch.no_grad():
        model.first.running_mean.fill_(100.0)  # type: ignore[union-attr]
    x = np.array([[1.0], [3.0], [5.0], [7.0]], np.float32)
    (m1, v1), (m2, v2) = adapted_statistics(model, x, batch_size=3)  # type: ignore[arg-type]
    # first: mean 4, unbiased var 20/3; its output is (x - 4) / sqrt(20/3), unbiased var 1;
    # the second layer's input 2 * that + 1: mean 1, var 4 (with the trained first
    # layer's mean of 100 it would be about -191)
    np.testing.assert_allclose([m1[0], v1[0]], [4.0, 20 / 3], rtol=1e-6)
    np.testing.assert_allclose([m2[0], v2[0]], [1.0, 4.0], rtol=1e-6)
    assert trained_statistics(model)[0][0][0] == pytest.approx(100.0)  # the model is kept


def test_fedapa_s_decides_from_the_fit_and_reports_it() -> None:
    fed = Federation("fedapa-session", clients=2, rounds=2).run()
    client: Any = fed.clients[0]
    gate = client.shift_gate()
    assert gate is not None
    assert gate.threshold == min(gate.session_ratios)
    x = client.shard.x_test
    decision = client.decide(x)
    assert decision.adapted == (decision.ratio >= gate.threshold)
    # the training windows sit where the trained statistics put them: no shift
    assert client.decide(client.shard.x_train).shift == pytest.approx(0.0, abs=1e-3)
    assert client.decide((x * 4.0).astype(np.float32)).shift > decision.shift
    predicted = client.predict(x)
    metrics = client.extra_metrics(x, client.shard.y_test)
    assert metrics["adapted"] == float(decision.adapted)
    assert metrics["fit_ratio"] == pytest.approx(decision.ratio)
    if not decision.adapted:  # the trained model as it is
        head = predict_logits(client.model, x).argmax(axis=1)
        np.testing.assert_array_equal(predicted, head)


def test_without_the_gate_every_session_adapts() -> None:
    fed = Federation("fedapa-session", clients=2, rounds=2, gate=False).run()
    client: Any = fed.clients[0]
    decision = client.decide(client.shard.x_test)
    assert decision.adapted
    assert decision.ratio is None
