"""What `mqttfl run` shows: the live view and the reference's bar on a terminal (in tmux,
as a person sees it), one line per round when piped, log records only with -v."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

from mqttfl.monitor.progress import ReferenceProgress, RoundClock, round_line
from mqttfl.monitor.view import FederationView
from tests.helpers import FAST, REPO, mqttfl
from tests.terminal import Tmux

TMUX_CAPTURE = Path("/tmp/mqttfl-run-tmux.txt")
SMALL = [*FAST, "federation.num_clients=3", "method.warmup_rounds=1"]


def test_the_round_clock_measures_rounds_after_the_first() -> None:
    clock = RoundClock(10, began=0.0)
    assert clock.line() == "round 0/10 done"
    clock.close(1, 5.0)  # the first round carries the start: not a rate yet
    assert clock.per_round() is None
    clock.close(2, 7.0)
    clock.close(4, 11.0)
    assert clock.per_round() == pytest.approx(2.0)
    assert clock.left() == pytest.approx(12.0)
    assert clock.line() == "round 4/10 done · 2.0 s/round · about 12 s left"
    view = FederationView("r")
    assert round_line(view, clock, 4) == (
        "round 4/10 closed · 0/0 uploads · 2.0 s/round, about 12 s left"
    )


def test_plain_reference_progress_is_one_line_per_round() -> None:
    console = Console(file=io.StringIO(), width=200)
    with ReferenceProgress(2, 3, console=console, live=False) as advance:
        for t in (1, 2, 3):
            advance("0", t)
            advance("1", t)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert [line.split(" · ")[0] for line in lines] == [
        "local reference: round 1/3",
        "local reference: round 2/3",
        "local reference: round 3/3",
    ]


@pytest.mark.slow
def test_run_piped_writes_one_line_per_round_and_no_log_records(tmp_path: Path) -> None:
    env = {**os.environ, "MQTTFL_CACHE_DIR": str(tmp_path / "cache")}
    args = ["run", "configs/fedapa-csi.toml", "--out", str(tmp_path / "run")]
    overrides = [a for item in [*SMALL, "rounds=3", "data.split=session"] for a in ("--set", item)]
    done = mqttfl(*args, *overrides, env=env, timeout=400)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rounds = [line for line in lines if re.match(r"round \d+/3 closed · 3/3 uploads", line)]
    assert [line.split(" · ")[0] for line in rounds] == [f"round {t}/3 closed" for t in (1, 2, 3)]
    assert [line for line in lines if line.startswith("local reference: round ")]
    assert "session split" in done.stdout
    assert re.search(
        r"federation (gained|lost|changed) [\d.]+ points over training alone", done.stdout
    )
    # structlog records only in the files
    assert "round.closed" not in done.stdout + done.stderr
    assert "[info" not in done.stderr
    events = (tmp_path / "run" / "logs" / "coordinator.jsonl").read_text()
    assert '"event": "round.closed"' in events
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["split"] == "session"
    assert summary["ordinal_labels"] is True


@pytest.mark.slow
def test_run_verbose_brings_the_records_back(tmp_path: Path) -> None:
    env = {**os.environ, "MQTTFL_CACHE_DIR": str(tmp_path / "cache")}
    args = ["run", "configs/fedapa-csi.toml", "-v", "--no-local-reference"]
    overrides = [a for item in [*SMALL, "rounds=2"] for a in ("--set", item)]
    done = mqttfl(*args, "--out", str(tmp_path / "run"), *overrides, env=env, timeout=400)
    assert done.returncode == 0, done.stderr
    assert "round.closed" in done.stderr


@pytest.mark.slow
def test_run_on_a_terminal_in_tmux(tmp_path: Path) -> None:
    assert shutil.which("tmux"), "tmux is missing: scripts/setup.sh installs it"
    command = [sys.executable, "-m", "mqttfl", "run", "configs/fedapa-csi.toml"]
    command += ["--out", str(tmp_path / "run")]
    for item in [*SMALL, "rounds=4", "data.split=session"]:
        command += ["--set", item]
    # as a person's terminal: its own size, not a COLUMNS the test runner may carry
    shell = (
        f"unset COLUMNS LINES; MQTTFL_CACHE_DIR={shlex.quote(str(tmp_path / 'cache'))} "
        + shlex.join(command)
        + "; echo run-exit=$?; sleep 600"
    )
    tmux = Tmux("run")
    try:
        tmux("new-session", "-d", "-s", "run", "-x", "120", "-y", "40", "-c", str(REPO), shell)
        live = tmux.wait_screen("mqttfl watch · run", "s/round · about", timeout=240)
        bar = tmux.wait_screen("local reference (each client alone)", timeout=240)
        final = tmux.wait_screen("run-exit=", timeout=240)
    finally:
        tmux.kill()
    TMUX_CAPTURE.write_text(f"{live}\n--- the Local reference ---\n{bar}\n--- the end ---\n{final}")
    assert re.search(r"round \d/4 done · [\d.]+ s/round · about \d+ s left", live)
    assert re.search(r"│ 0 +│ - +│ online +│", live), live
    assert "run-exit=0" in final
    # the view is drawn in place: one header, and no log record on the screen
    assert live.count("mqttfl watch · run") == 1
    assert final.count("mqttfl watch · run") <= 1
    assert "round.closed" not in final
    assert "[info" not in final
    assert "federation " in final
    assert "points over training alone" in final
