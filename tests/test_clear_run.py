"""A run id runs again from a clean slate with one command whose broker ACL still fits.

On a broker from `broker init --run-id`, whose ACL names the run id: a whole run
(coordinator and forked clients, real processes), then the same coordinator command,
which stops with one line whose first suggestion is `--clear-run` with the same --out,
then that command: the run's retained messages are cleared, the old run directory is
set aside beside it (renamed, nothing deleted) and the run starts afresh, the clients
started again as before (same ids, credentials and state folder).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from mqttfl.files import set_aside_dir
from tests.faults import CONFIG, TINY, read_events
from tests.helpers import REPO, mqttfl
from tests.locked import Locked, Started, locked_broker
from tests.run_files import one_line_error, snapshot

RUN = "again"
SETS = [
    arg
    for setting in (
        *TINY,
        f"run_id={RUN}",
        "rounds=1",
        "federation.num_clients=2",
        "federation.min_clients=2",
    )
    for arg in ("--set", setting)
]
RUN_S = 300.0


def coordinator(broker: Locked, name: str, out: Path, *extra: str, console: str) -> Started:
    args = ["--config", str(REPO / CONFIG), "--broker", broker.url, "--out", str(out)]
    return broker.start(
        name,
        "coordinator",
        *args,
        *SETS,
        *extra,
        identity="coordinator",
        MQTTFL_CONSOLE_LEVEL=console,
    )


def clients(broker: Locked, name: str) -> Started:
    return broker.start(
        name,
        "clients",
        "--config",
        str(REPO / CONFIG),
        "--broker",
        broker.url,
        *SETS,
        "--ids",
        "0-1",
        "--credentials-dir",
        str(broker.credentials),
        "--state-dir",
        str(broker.work / "client-state"),
        identity=None,
    )


def whole_run(broker: Locked, name: str, out: Path, *extra: str) -> Started:
    """A coordinator (with ``extra``) and, once it has started, the clients: both end 0."""
    coord = coordinator(broker, name, out, *extra, console="info")  # to see run.started
    deadline = time.monotonic() + RUN_S
    while "run.started" not in coord.stderr:
        assert coord.proc.poll() is None, coord.stderr[-3000:]
        assert time.monotonic() < deadline, coord.stderr[-3000:]
        time.sleep(0.2)
    devices = clients(broker, f"{name}-clients")
    assert devices.wait(RUN_S) == 0, devices.stderr[-3000:]
    assert coord.wait(RUN_S) == 0, coord.stderr[-3000:]
    return coord


@pytest.mark.slow
def test_a_finished_run_id_starts_again_with_one_command_on_a_locked_broker() -> None:
    with locked_broker(RUN) as broker:
        site = broker.work / "runs" / "site"
        whole_run(broker, "first", site)
        first = snapshot(site)
        assert json.loads(first["summary.json"])["rounds_completed"] == 1

        again = coordinator(broker, "again", site, console="error")
        assert again.wait(RUN_S) == 2
        line = again.one_error_line()
        assert f"run '{RUN}' already finished at" in line
        # the command that fits the ACL comes first; a new run id needs an ACL of its own
        assert line.index("--clear-run") < line.index("--set run_id=NEW"), line
        assert "with the same --out" in line
        assert "broker init --run-id NEW" in line
        assert snapshot(site) == {**first, **_logs(site)}  # refused: nothing set aside

        whole_run(broker, "afresh", site, "--clear-run")
        (previous,) = site.parent.glob("site.previous-*")
        kept = snapshot(previous)
        assert {k: v for k, v in kept.items() if not k.startswith("logs/")} == {
            k: v for k, v in first.items() if not k.startswith("logs/")
        }
        fresh = json.loads((site / "summary.json").read_text())
        assert fresh["rounds_completed"] == 1  # (seeded: the same numbers as the first)
        events = read_events(site / "logs" / "coordinator.jsonl")
        (aside,) = [e for e in events if e["event"] == "run.set_aside"]
        assert aside["kept_as"] == str(previous)
        # started afresh, where the first run started, not resumed after its end
        assert _started_from(site) == _started_from(previous) == [1]
        for client in ("0", "1"):  # each device set aside the state of the finished run
            log = broker.work / "afresh-clients" / "logs" / f"client-{client}.jsonl"
            assert any(e["event"] == "state.discarded" for e in read_events(log)), client
        _each_instance_is_told_apart(broker.work, previous, site)


def _tagged_from(events: list[dict[str, Any]], first: str) -> set[object]:
    """The instances that the lines of the process start that wrote the event ``first``
    carry from that event on (None: an untagged line)."""
    at = next(i for i, e in enumerate(events) if e["event"] == first)
    start = events[at]["start"]
    return {e.get("instance") for e in events[at:] if e["start"] == start}


def _each_instance_is_told_apart(work: Path, previous: Path, site: Path) -> None:
    """Every line a process writes once it knows the run instance carries it, and
    `mqttfl logs --instance` shows one instance of the run id across every process."""
    (old,) = _tagged_from(read_events(previous / "logs" / "coordinator.jsonl"), "run.started")
    (new,) = _tagged_from(read_events(site / "logs" / "coordinator.jsonl"), "run.started")
    assert isinstance(new, str)
    assert isinstance(old, str)
    assert new != old
    for name, instance in (("first-clients", old), ("afresh-clients", new)):
        for client in ("0", "1"):
            events = read_events(work / name / "logs" / f"client-{client}.jsonl")
            assert _tagged_from(events, "run.joined") == {instance}, (name, client)
    dirs = [previous, site, work / "first-clients", work / "afresh-clients"]
    shown = mqttfl("logs", *map(str, dirs), "--instance", new[:6], "--json")
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert {line["instance"] for line in lines} == {new}
    # (files of one name in several directories are named by their directory too)
    seen = {(line["process"].rsplit("/", 1)[-1], line["event"]) for line in lines}
    assert {("coordinator", "round.closed"), ("client-0", "upload.sent")} <= seen, seen
    assert {line["process"].split("/")[0] for line in lines} == {"site", "afresh-clients"}
    everything = mqttfl("logs", *map(str, dirs), "--json")
    instances = {json.loads(line).get("instance") for line in everything.stdout.splitlines()}
    assert {old, new} <= instances


def _started_from(run: Path) -> list[int]:
    events = read_events(run / "logs" / "coordinator.jsonl")
    return [e["from_round"] for e in events if e["event"] == "run.started"]


def _logs(directory: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(directory).items() if k.startswith("logs/")}


def test_a_run_directory_is_set_aside_whole_and_made_again(tmp_path: Path) -> None:
    site = tmp_path / "runs" / "site"
    assert set_aside_dir(site, what="--out") is None  # nothing there: nothing to do
    site.mkdir(parents=True)
    assert set_aside_dir(site, what="--out") is None  # empty: left as it is
    (site / "logs").mkdir()
    (site / "logs" / "coordinator.jsonl").write_text("{}\n")
    (site / "summary.json").write_text("{}")
    before = snapshot(site)
    kept = set_aside_dir(site, what="--out")
    assert kept is not None
    assert kept.parent == site.parent
    assert kept.name.startswith("site.previous-")
    assert snapshot(kept) == before  # nothing deleted
    assert site.is_dir()
    assert not any(site.iterdir())


def test_the_folder_you_are_in_is_not_set_aside(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    result = mqttfl(
        "coordinator",
        "--config",
        str(REPO / CONFIG),
        "--broker",
        "mqtt://127.0.0.1:1",
        "--out",
        ".",
        "--clear-run",
        cwd=tmp_path,
        timeout=120,
    )
    line = one_line_error(result)
    assert "--out .: the directory you are in" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
