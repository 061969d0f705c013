"""A client killed with SIGKILL mid-run does not stall the federation."""

from __future__ import annotations

import functools
import json
import operator
import os
import signal
import subprocess
from pathlib import Path

import pytest

from mqttfl.provisioning.local_broker import LocalBroker
from tests.faults import read_events, wait_for
from tests.helpers import FAST, mqttfl, spawn

pytestmark = pytest.mark.slow
CONFIG = "configs/fedapa-csi.toml"


def test_sigkill_of_one_client_mid_run(broker: LocalBroker, tmp_path: Path) -> None:
    out, logs = tmp_path / "run", tmp_path / "logs"
    env = {"MQTTFL_LOG_DIR": str(logs)}
    common = [
        "--config",
        CONFIG,
        "--broker",
        broker.url,
        "--set",
        "rounds=6",
        "--set",
        "federation.num_clients=3",
        *functools.reduce(operator.iadd, (["--set", s] for s in FAST), []),
    ]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        procs["coordinator"] = spawn(
            "coordinator", *common, "--out", str(out), log=tmp_path / "c.out", env=env
        )
        for cid in "012":
            procs[cid] = spawn(
                "client",
                *common,
                "--id",
                cid,
                "--state-dir",
                str(tmp_path / "state"),
                log=tmp_path / f"{cid}.out",
                env=env,
            )
        coordinator_log = logs / "coordinator.jsonl"

        def closed_rounds() -> list[int]:
            return [
                e["round"] for e in read_events(coordinator_log) if e["event"] == "round.closed"
            ]

        wait_for(lambda: 2 in closed_rounds(), timeout=120, what="the run to get there")
        os.killpg(procs["2"].pid, signal.SIGKILL)
        killed_after = max(closed_rounds())
        # a hostile upload for a round that does not exist yet: rejected, run goes on
        subprocess.run(
            [
                "mosquitto_pub",
                "-h",
                "127.0.0.1",
                "-p",
                str(broker.port),
                "-q",
                "1",
                "-t",
                "mqttfl/fedapa-csi/round/99/up/0",
                "-m",
                "garbage",
            ],
            check=True,
            timeout=10,
        )

        assert procs["coordinator"].wait(timeout=240) == 0, (tmp_path / "c.out").read_text()[-3000:]
        for cid in "01":
            assert procs[cid].wait(timeout=60) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    events = read_events(coordinator_log)
    offline = [e for e in events if e["event"] == "client.offline" and e["client"] == "2"]
    assert offline
    assert offline[0]["reason"] == "connection lost"
    assert any(e["event"] == "upload.rejected" and e["reason"] == "future" for e in events)
    closed = {e["round"]: e for e in events if e["event"] == "round.closed"}
    assert sorted(closed) == [1, 2, 3, 4, 5, 6]
    for t in range(killed_after + 2, 7):  # rounds wholly after the kill: both survivors aggregated
        assert closed[t]["uploads"] == 2
    # causal order: a round is announced only after the round before it closed
    order = [(e["event"], e["round"]) for e in events if e["event"].startswith("round.")]
    for t in range(2, 7):
        assert order.index(("round.closed", t - 1)) < order.index(("round.started", t)), order
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 6
    assert summary["rejections"] == {"future": 1}


def test_a_client_that_left_and_came_back_is_shown_in_the_results(
    broker: LocalBroker, tmp_path: Path
) -> None:
    """Client 2 is killed after round 2 and restarted two rounds later: summary.json
    gives its part (selected, uploaded, missed; the rounds it left and came back in), and
    the coordinator's final table says so with the rounds its figures cover."""
    from tests.faults import Federation

    with Federation(tmp_path, broker, clients=3, rounds=30) as fed:
        fed.start()
        fed.wait_round_closed(2, timeout=120)
        fed.kill("2")
        gone = fed.last_closed()
        fed.wait_round_closed(gone + 2, timeout=120)
        fed.restart("2")
        summary = fed.finish(timeout=180)
    row = summary["clients"]["2"]
    assert len(row["left"]) == 1
    assert gone <= row["left"][0] <= gone + 1
    assert len(row["rejoined"]) == 1
    assert row["rejoined"][0] > row["left"][0]
    assert row["uploaded"] + row["missed"] == row["selected"]
    assert row["uploaded"] < summary["rounds_completed"]
    assert row["last_rounds"] == sorted(row["last_rounds"])
    for steady in ("0", "1"):
        assert summary["clients"][steady]["uploaded"] == summary["rounds_completed"]
        assert "left" not in summary["clients"][steady] or not summary["clients"][steady]["left"]
    table = fed.output("coordinator")
    line = next(x for x in table.splitlines() if x.startswith("client 2: "))
    assert f"left in round {row['left'][0]}, back in round {row['rejoined'][0]}" in line
    # the report: its per-client table and a plot marking the departure and the return
    report = tmp_path / "report"
    result = mqttfl("report", str(fed.out), "--out", str(report))
    assert result.returncode == 0, result.stderr
    markdown = (report / "report.md").read_text()
    cells = f"| {row['uploaded']} / {row['selected']} | {row['left'][0]}, {row['rejoined'][0]} |"
    assert cells in markdown
    assert (report / f"clients-{fed.out.name}.png").stat().st_size > 0


def test_the_dropout_demo_walk_through(broker: LocalBroker, tmp_path: Path) -> None:
    """README, "A dropout demo", command by command from a fresh folder (only shorter:
    20 rounds paced at 1.5 s): four devices that fetch the run from its manifest, two
    killed by their pid files, one brought back; `mqttfl logs` tells the story and the
    final table says who left and came back."""
    from tests.helpers import REPO

    url, demo = broker.url, str(REPO / "configs" / "dropout-demo.toml")
    shorter = ["--set", "rounds=20", "--set", "federation.pace_s=1.5"]
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def device(cid: str, n: int) -> None:
        args = ["client", "--run", "dropout-demo", "--id", cid, "--broker", url]
        procs[f"{cid}.{n}"] = spawn(*args, log=tmp_path / f"{cid}.{n}.out", cwd=tmp_path)

    def coordinator_events(event: str) -> list[dict[str, object]]:
        found = read_events(tmp_path / "runs" / "demo" / "logs" / "coordinator.jsonl")
        return [e for e in found if e["event"] == event]

    try:
        args = ["coordinator", "--config", demo, "--broker", url, "--out", "runs/demo"]
        procs["coordinator"] = spawn(*args, *shorter, log=tmp_path / "c.out", cwd=tmp_path)
        for cid in "0123":
            device(cid, 1)
        wait_for(lambda: len(coordinator_events("round.closed")) >= 3, timeout=180, what="round 3")
        for cid in "12":
            pid_file = f"client-state/dropout-demo/client-{cid}.pid"
            killed = subprocess.run(["pkill", "-9", "-L", "-F", pid_file], cwd=tmp_path)
            assert killed.returncode == 0
        wait_for(
            lambda: {e["client"] for e in coordinator_events("client.offline")} >= {"1", "2"},
            timeout=30,
            what="the last wills of 1 and 2",
        )
        device("2", 2)
        assert procs["coordinator"].wait(timeout=300) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    told = mqttfl(
        "logs",
        "runs/demo",
        "logs",
        "--event",
        "client.*",
        "--event",
        "round.closed",
        "--json",
        cwd=tmp_path,
    )
    assert told.returncode == 0, told.stderr
    events = [json.loads(line) for line in told.stdout.splitlines()]
    offline = [e for e in events if e["event"] == "client.offline"]
    assert {e["client"] for e in offline} == {"1", "2"}
    assert all(e["reason"] == "connection lost" for e in offline)
    back = [e for e in events if e["event"] == "client.online" and e.get("client") == "2"]
    assert back[-1]["timestamp"] > max(e["timestamp"] for e in offline)
    assert any(e["event"] == "client.resumed" and e["process"] == "client-2" for e in events)
    table = (tmp_path / "c.out").read_text()
    assert "client 1: " in table
    assert "left in round" in table.split("client 1: ")[1].splitlines()[0]
    assert "back in round" in table.split("client 2: ")[1].splitlines()[0]
