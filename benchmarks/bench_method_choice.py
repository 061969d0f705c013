"""The default job's method, chosen on validation across sessions, then scored on test.

The default job (configs/fedapa-csi.toml) is scored on a recording day no client trained
on. Its method is chosen the same way, never on that day: each client holds out the later
of its two training days (``data.validation_fraction=0.5``,
:func:`mqttfl.data.sources.session_validation_shard`), trains on the other, and the method
with the best mean client accuracy on the held-out day over ``SEEDS`` is the choice. Then
every method is scored on the test day (trained on both training days), so the table shows
where the choice lands and what choosing on test would have bought (the selection's
optimism, reported, never used).

Each federation runs in process (:func:`benchmarks.bench_sessions.federate`: every
method's own client and server sides, full participation, scored once after the last
round), on the default job as shipped.

    python -m benchmarks.bench_method_choice [--quick]   # quick: seed 0, 2 rounds, 60 windows

``BENCH_CHOICE_METHODS=local,fedavg`` and ``BENCH_CHOICE_SEEDS=0,1`` narrow the grid.
``BENCH_CHOICE_SPLIT=window`` runs it under the papers' split instead (test: a fifth of
each day's windows; validation: a stratified fifth of each client's training windows),
into method_choice-window.json. Cells already in the results file for the same overrides
are kept, so an interrupted run picks up where it stopped.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Mapping
from typing import Any

from benchmarks.common import RESULTS, bench_main, log, write_result

#: per split, what validation holds out: under the session split one of the default job's
#: two training days (synthetic rooms: the later one); under the window split a fifth of
#: each client's training windows, as its test split is a fifth of each day's
VALIDATION = {"session": "data.validation_fraction=0.5", "window": "data.validation_fraction=0.2"}
SEEDS = (0, 1, 2)
SOURCE = "default"


def chosen_split() -> str:
    split = os.environ.get("BENCH_CHOICE_SPLIT", "session")
    if split not in VALIDATION:
        raise SystemExit(f"BENCH_CHOICE_SPLIT: {split!r} is not one of {', '.join(VALIDATION)}")
    return split


def results_name(split: str) -> str:
    return "method_choice" if split == "session" else f"method_choice-{split}"


def candidates() -> list[str]:
    from benchmarks.bench_sessions import DEFAULT_METHODS, METHODS

    return list(METHODS)[:DEFAULT_METHODS]


def choose(validation: Mapping[str, Mapping[str, float]]) -> str:
    """``validation[method][seed]`` (accuracy) -> the method with the best mean over seeds;
    a tie goes to the method listed first."""
    best, best_mean = "", float("-inf")
    for method, by_seed in validation.items():
        mean = statistics.fmean(by_seed.values())
        if mean > best_mean:
            best, best_mean = method, mean
    if not best:
        raise ValueError("no method was scored on validation")
    return best


def summary(
    validation: Mapping[str, Mapping[str, float]], test: Mapping[str, Mapping[str, float]]
) -> dict[str, Any]:
    """The choice, its test accuracy beside Local's, and the method test would have chosen."""
    chosen = choose(validation)
    mean_test = {m: statistics.fmean(s.values()) for m, s in test.items()}
    out: dict[str, Any] = {
        "chosen": chosen,
        "validation_mean": {m: statistics.fmean(s.values()) for m, s in validation.items()},
        "test_mean": mean_test,
        "best_on_test": max(mean_test, key=lambda m: mean_test[m]) if mean_test else None,
    }
    if chosen in mean_test and "local" in mean_test:
        out["chosen_gain_over_local"] = mean_test[chosen] - mean_test["local"]
    return out


def run(quick: bool) -> dict[str, Any]:
    import torch

    from benchmarks.bench_sessions import SOURCES, _listed, score

    torch.set_num_threads(1)
    source = SOURCES[SOURCE]
    split = chosen_split()
    extra = source.quick if quick else []
    seeds = [
        int(s) for s in _listed("BENCH_CHOICE_SEEDS", [str(s) for s in SEEDS][: 1 if quick else 3])
    ]
    methods = _listed("BENCH_CHOICE_METHODS", candidates())
    name = results_name(split)
    path = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    overrides = [*source.overrides, *extra]
    tables: dict[str, dict[str, dict[str, float]]] = {"validation": {}, "test": {}}
    if path.exists():
        previous = json.loads(path.read_text())
        if previous.get("overrides") == overrides:
            tables = previous.get("tables", tables)
    for part, part_extra in (("validation", [*extra, VALIDATION[split]]), ("test", extra)):
        for method in methods:
            cells = tables[part].setdefault(method, {})
            for seed in seeds:
                if str(seed) in cells:
                    continue
                start = time.perf_counter()
                cells[str(seed)] = score(source, method, seed, split, part_extra)["accuracy"]
                log(
                    f"{part} {method} seed {seed}: {cells[str(seed)]:.1f} "
                    f"({time.perf_counter() - start:.0f} s)"
                )
                # written after every cell: a long grid survives an interruption
                write_result(
                    name,
                    _document(tables, overrides, seeds, split),
                    quick=quick,
                    command=_command(split),
                )
    document = _document(tables, overrides, seeds, split)
    choice = document["summary"]
    log(f"chosen on validation: {choice['chosen']}; best on test: {choice['best_on_test']}")
    return document


def _document(
    tables: dict[str, dict[str, dict[str, float]]],
    overrides: list[str],
    seeds: list[int],
    split: str,
) -> dict[str, Any]:
    complete = {part: {m: s for m, s in table.items() if s} for part, table in tables.items()}
    return {
        "what": f"mean client accuracy (%) of the default job's methods under the {split} "
        "split: on held-out training data (validation, which chooses) and on the test split",
        "config": "configs/fedapa-csi.toml",
        "split": split,
        "overrides": overrides,
        "validation": VALIDATION[split],
        "seeds": seeds,
        "tables": tables,
        "summary": summary(complete["validation"], complete["test"])
        if complete["validation"]
        else {},
    }


def _command(split: str) -> str:
    prefix = "" if split == "session" else f"BENCH_CHOICE_SPLIT={split} "
    return f"{prefix}python -m benchmarks.bench_method_choice"


def main() -> None:
    split = chosen_split()
    bench_main(
        results_name(split),
        "the default job's method, chosen on validation",
        run,
        command=_command(split),
    )


if __name__ == "__main__":
    main()
