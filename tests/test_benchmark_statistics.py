"""The statistics the benchmarks report: paired t intervals and nested selection."""

from __future__ import annotations

import pytest

from benchmarks.bench_fedapa_bounded_accuracy import interval
from benchmarks.bench_method_choice import choose, summary
from benchmarks.bench_session_selection import nested_choice


def test_interval_is_the_95_percent_t_interval() -> None:
    result = interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(0.975, 2 df) = 4.303
    assert result["mean"] == pytest.approx(2.0)
    assert result["half_width"] == pytest.approx(4.303 / 3**0.5)
    assert result["low"] == pytest.approx(2.0 - 4.303 / 3**0.5)


def test_nested_choice_never_scores_a_client_with_a_variant_chosen_on_it() -> None:
    # "a" is best on client 0 alone; chosen on clients 1 and 2, "b" wins for client 0.
    scores = {"a": {"0": 90.0, "1": 50.0, "2": 50.0}, "b": {"0": 10.0, "1": 60.0, "2": 60.0}}
    result = nested_choice(scores)
    assert result["chosen"] == {"0": "b", "1": "a", "2": "a"}  # 1: a 70 vs b 35 on {0, 2}
    assert result["scores"] == {"0": 10.0, "1": 50.0, "2": 50.0}
    assert result["mean"] == pytest.approx(110.0 / 3)


def test_the_default_jobs_method_is_chosen_on_validation_never_on_test() -> None:
    # "b" has the best validation mean (60 vs 55), "a" the best test mean: "b" is chosen.
    validation = {
        "local": {"0": 50.0, "1": 50.0},
        "a": {"0": 50.0, "1": 60.0},
        "b": {"0": 60.0, "1": 60.0},
    }
    test = {
        "local": {"0": 20.0, "1": 20.0},
        "a": {"0": 40.0, "1": 40.0},
        "b": {"0": 21.0, "1": 23.0},
    }
    result = summary(validation, test)
    assert result["chosen"] == "b"
    assert result["best_on_test"] == "a"
    assert result["chosen_gain_over_local"] == pytest.approx(2.0)


def test_a_tie_on_validation_goes_to_the_method_listed_first() -> None:
    assert choose({"local": {"0": 50.0}, "fedapa": {"0": 50.0}}) == "local"
    with pytest.raises(ValueError, match="no method"):
        choose({})
