"""`mqttfl watch`: the pure view on hand-made (and hostile) messages, then the real command
against a running federation: piped, `--once`, and on a terminal inside tmux."""

from __future__ import annotations

import io
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

import mqttfl.monitor.live as watch
import mqttfl.monitor.view as view_module
from mqttfl.commands import main as cli
from mqttfl.monitor.live import watch_topics
from mqttfl.monitor.view import FederationView, render
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from mqttfl.wire.codec import Message, encode
from mqttfl.wire.control import (
    Ack,
    Metrics,
    Offline,
    Online,
    RoundStart,
    RunStatus,
)
from mqttfl.wire.schemas import ClientInfo
from tests.faults import RUN_ID, Federation, Seen, Witness, wait_for
from tests.helpers import REPO, mqttfl
from tests.terminal import Tmux

RUN = "r1"
T = Topics(RUN)
LIMIT = 10_000  # max_upload_bytes of the view under test
TMUX_CAPTURE = Path("/tmp/mqttfl-watch-tmux.txt")


def _online(client: str, run: str = RUN) -> bytes:
    return Online(ClientInfo(client, "tiny", (0, 1), 40, (24, 52))).encode(run)


def _upload(t: int, client: str, *, sender: str | None = None, kind: str = "upload") -> bytes:
    body = {"protos": np.zeros((2, 4), np.float32), "counts": np.ones(2, np.int64)}
    return encode(Message(kind, RUN, t, sender or client, body))


def _metrics(t: int, client: str, accuracy: float, mae: float) -> bytes:
    return Metrics(t, client, {"accuracy": accuracy, "f1": accuracy, "mae": mae}).encode(RUN)


def _screen(view: FederationView, now: float, *, recent: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render(view, now, recent=recent))
    return out.getvalue()


def _row(screen: str, client: str) -> str:
    return next(line for line in screen.splitlines() if line.startswith(f"│ {client} "))


# --- the pure view -------------------------------------------------------------------------
async def test_a_watcher_started_mid_run_paints_the_retained_state_at_once() -> None:
    """The broker hands a new subscriber the retained statuses and run status in one burst:
    the frame after it shows them, not the empty view until the next refresh tick."""
    import asyncio
    import types

    from mqttfl.bus.transport import Incoming

    view = FederationView(RUN, max_upload_bytes=LIMIT)
    view.connection(True, time.monotonic())
    start = RoundStart(7, ("0", "1"), 30.0, {}, announcement=1)
    bus: Any = types.SimpleNamespace(incoming=asyncio.Queue())
    for topic, payload in [
        (T.status("0"), _online("0")),
        (T.status("1"), _online("1")),
        (T.state, RunStatus("open", 7, start).encode(RUN)),
    ]:
        bus.incoming.put_nowait(Incoming(topic, payload, retained=True))
    frames: list[str] = []

    def paint() -> None:
        frames.append(_screen(view, time.monotonic()).splitlines()[1])

    # well inside one refresh interval: only a paint for the burst can show it
    await watch.listen(view, bus, until=time.monotonic() + 0.3 / watch.REFRESH_PER_S, paint=paint)
    assert frames[0] == "no run status yet"
    assert frames[1].startswith("round 7 open"), frames


def test_a_client_back_from_a_dropout_shows_only_the_rounds_it_trained_in() -> None:
    view = FederationView(RUN, max_upload_bytes=LIMIT)
    view.connection(True, 0.0)
    for c in "012":
        view.apply(T.status(c), _online(c), 0.1)

    def round_of(t: int, uploaders: str, *, held: tuple[str, ...] = ()) -> None:
        start = RoundStart(t, ("0", "1", "2"), 30.0, {}, uploaded=held, announcement=t)
        view.apply(T.start(t), start.encode(RUN), float(t))
        for c in uploaders:
            view.apply(T.up(t, c), _upload(t, c), t + 0.5)
        view.apply(T.state, RunStatus("closed", t).encode(RUN), t + 0.6)

    round_of(1, "012")
    assert view.apply(T.metrics(1, "2"), _metrics(1, "2", 0.5, 2.0), 1.7)
    # client 2 is away in round 2; back, it evaluates round 2's downlink: not its score
    round_of(2, "01")
    assert view.apply(T.metrics(2, "0"), _metrics(2, "0", 0.6, 1.5), 2.7)
    assert view.apply(T.metrics(2, "2"), _metrics(2, "2", 0.9, 0.5), 2.8) == []
    assert re.search(r"│ 2 .*│ +0\.500 │ +2\.00 │ +1 │", _screen(view, 3.0))
    # it trains in round 3 again; and in round 4 the coordinator holds its upload
    round_of(3, "012")
    assert view.apply(T.metrics(3, "2"), _metrics(3, "2", 0.7, 1.0), 3.7)
    round_of(4, "01", held=("2",))
    assert view.apply(T.metrics(4, "2"), _metrics(4, "2", 0.8, 0.75), 4.7)
    assert re.search(r"│ 2 .*│ +0\.800 │ +0\.75 │ +4 │", _screen(view, 5.0))


def test_the_view_follows_a_round_from_the_retained_status_to_the_finish() -> None:
    view = FederationView(RUN, max_upload_bytes=LIMIT)
    assert view.connection(True, 100.0) == ["connected to the broker"]
    # What the broker hands a new subscriber at once: retained statuses and run status.
    assert view.apply(T.status("0"), _online("0"), 100.1) == ["client 0 online"]
    assert view.apply(T.status("1"), _online("1"), 100.1) == ["client 1 online"]
    offline = Offline("2", "connection lost").encode(RUN)
    assert view.apply(T.status("2"), offline, 100.1) == ["client 2 offline (connection lost)"]
    first = RoundStart(3, ("0", "1", "2"), 30.0, {}, announcement=5)
    assert view.apply(T.state, RunStatus("open", 3, first).encode(RUN), 100.2) == [
        "round 3 open: 3 selected, deadline ≤30s"  # maybe an old copy: an upper bound
    ]
    assert view.closed_through == 2
    screen = _screen(view, 110.2)
    assert "round 3 open · deadline ≤20s · uploads 0/3 · missing 0, 1, 2" in screen
    assert "clients 2 online, 1 offline" in screen
    assert "rounds closed 2" in screen
    assert "offline (connection lost)" in _row(screen, "2")

    # Live: the round is announced again; the coordinator already holds client 1's upload.
    again = RoundStart(3, ("0", "1", "2"), 58.0, {}, attempt=2, uploaded=("1",), announcement=6)
    assert view.apply(T.start(3), again.encode(RUN), 120.0) == [
        "round 3 open (attempt 2): 3 selected, deadline 58s"
    ]
    assert view.apply(T.status("2"), _online("2"), 120.5) == ["client 2 online"]
    assert view.apply(T.ack(3, "2"), Ack(3, "2", 6).encode(RUN), 120.6) == []
    assert view.apply(T.up(3, "0"), _upload(3, "0"), 121.0) == ["client 0 uploaded round 3 (2/3)"]
    assert view.apply(T.metrics(2, "0"), _metrics(2, "0", 0.75, 1.25), 121.5) == [
        "client 0 round 2: accuracy 0.750, MAE 1.25"
    ]
    assert view.apply(T.metrics(1, "0"), _metrics(1, "0", 0.5, 3.0), 121.6) == []  # older
    screen = _screen(view, 128.0, recent=True)
    assert "round 3 open · deadline 50s · uploads 2/3 · missing 2" in screen
    assert re.search(r"│ 0 +│ - +│ online +│ uploaded +│ +0\.750 │ +1\.25 │ +2 │", screen)
    assert "uploaded" in _row(screen, "1")
    assert "training" in _row(screen, "2")
    assert "client 0 uploaded round 3 (2/3)" in screen  # the recent events under the table

    assert view.apply(T.state, RunStatus("closed", 3).encode(RUN), 130.0) == ["round 3 closed"]
    screen = _screen(view, 131.0)
    assert "round 3 closed · waiting for round 4" in screen
    assert "missed" in _row(screen, "2")
    assert view.apply(T.state, RunStatus("closed", 3).encode(RUN), 130.5) == []  # a repeat
    assert not view.finished
    assert view.apply(T.state, RunStatus("finished", 3).encode(RUN), 140.0) == [
        "run finished after round 3"
    ]
    assert view.finished
    assert view.rejected == {}
    assert "run finished after round 3" in _screen(view, 141.0)
    assert view.connection(False, 142.0) == ["broker connection lost, reconnecting"]
    assert "broker not connected" in _screen(view, 142.0)


def test_a_live_start_makes_the_retained_deadline_exact() -> None:
    view = FederationView(RUN)
    view.connection(True, 0.0)
    start = RoundStart(1, ("0",), 30.0, {}, announcement=1)
    assert view.apply(T.state, RunStatus("open", 1, start).encode(RUN), 0.1) == [
        "round 1 open: 1 selected, deadline ≤30s"
    ]
    assert not view.deadline_exact
    assert view.apply(T.start(1), start.encode(RUN), 0.2) == []  # same announcement
    assert view.deadline_exact
    assert view.deadline == pytest.approx(30.2)
    # Long after connecting, a run status is live: its deadline is exact.
    later = RoundStart(2, ("0",), 20.0, {}, announcement=2)
    assert view.apply(T.state, RunStatus("open", 2, later).encode(RUN), 40.0) == [
        "round 2 open: 1 selected, deadline 20s"
    ]
    assert view.closed_through == 1
    # Tallies of rounds long gone are dropped; an old start changes nothing.
    assert view.apply(T.start(1), start.encode(RUN), 41.0) == []
    assert view.round == 2


def test_a_site_is_shown_when_a_status_carries_one(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass(frozen=True)
    class SitedOnline(Online):
        site: Any = None

    sites = {"0": "building-a", "1": "\x1b[2J[red]evil", "2": 42}

    def read_status(raw: bytes, *, run_id: str, client: str) -> SitedOnline:
        return SitedOnline(ClientInfo(client, "tiny", (0, 1), 40, (24, 52)), sites[client])

    monkeypatch.setattr(view_module, "read_status", read_status)
    view = FederationView(RUN)
    assert view.apply(T.status("0"), b"", 1.0) == []  # a cleared retained status
    assert view.apply(T.status("0"), b"x", 1.0) == ["client 0 online at building-a"]
    view.apply(T.status("1"), b"x", 1.0)
    view.apply(T.status("2"), b"x", 1.0)
    screen = _screen(view, 2.0)
    assert "building-a" in _row(screen, "0")
    assert "?[2J[red]evil" in _row(screen, "1")  # no escape reaches the terminal
    assert re.search(r"│ 2 +│ - +│ online", screen)  # a site that is not text is not shown
    assert "\x1b" not in screen


HOSTILE = [
    (T.status("0"), b"\xc1 not msgpack", "malformed"),
    (T.status("0"), _online("0", run="other"), "run"),
    (T.status("0"), _online("1"), "sender"),
    (T.state, encode(Message("state", RUN, 2, "0", {"phase": "closed"})), "sender"),
    (T.state, encode(Message("state", RUN, 2, "coordinator", {"phase": "done"})), "range"),
    (T.start(1), RoundStart(2, ("0",), 30.0, {}).encode(RUN), "round_mismatch"),
    (
        T.metrics(1, "0"),
        encode(Message("metrics", RUN, 1, "0", {"accuracy": 7.0, "f1": 0.5, "mae": 1.0})),
        "range",
    ),
    (
        T.metrics(1, "0"),
        encode(Message("metrics", RUN, 1, "0", {"accuracy": 0.5})),
        "missing_field",
    ),
    (T.ack(1, "0"), Ack(1, "1").encode(RUN), "sender"),
    (T.up(1, "0"), _upload(1, "0", sender="1"), "sender"),
    (T.up(1, "0"), _upload(1, "0", kind="metrics"), "type"),
    (T.up(1, "0"), _upload(2, "0"), "round_mismatch"),
    (T.up(1, "0"), b"", "malformed"),
    (T.up(1, "0"), b"\0" * (LIMIT + 1), "oversize"),
    ("mqttfl/other/state", b"", "topic"),
    (f"mqttfl/{RUN}/round/01/up/0", _upload(1, "0"), "topic"),
    (f"mqttfl/{RUN}/round/1/up/a+b", _upload(1, "0"), "bad_id"),
    (T.down_all(1), b"x", "topic"),  # the watcher never reads downlinks
]


@pytest.mark.parametrize(("topic", "payload", "reason"), HOSTILE)
def test_a_hostile_message_is_counted_by_its_reason_and_changes_nothing(
    topic: str, payload: bytes, reason: str
) -> None:
    view = FederationView(RUN, max_upload_bytes=LIMIT)
    [event] = view.apply(topic, payload, 1.0)
    assert event.startswith("rejected ")
    assert event.endswith(f": {reason}")
    assert view.rejected == {reason: 1}
    assert view.clients == {}
    assert view.uploads == {}
    assert view.phase == "unknown"
    assert view.round == 0
    assert f"rejected messages: {reason} 1" in _screen(view, 2.0)


def test_rejections_add_up_by_reason_next_to_good_messages() -> None:
    view = FederationView(RUN, max_upload_bytes=LIMIT)
    for topic, payload, _ in HOSTILE:
        view.apply(topic, payload, 1.0)
    view.apply(T.status("0"), _online("0"), 1.0)
    assert view.clients["0"].online is True
    assert view.messages == len(HOSTILE) + 1
    assert sum(view.rejected.values()) == len(HOSTILE)
    assert view.rejected["sender"] == 4
    assert view.rejected["topic"] == 3


# Anything at all on the run's topics: random bytes, or envelopes with random bodies.
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
_KEYS = [
    "state", "arch", "classes", "num_samples", "sample_shape", "reason", "phase", "start",
    "selected", "timeout_s", "params", "attempt", "uploaded", "announcement", "accuracy",
    "f1", "mae",
]  # fmt: skip
_ENVELOPES = st.builds(
    lambda kind, t, sender, body: msgpack.packb(
        {"v": 1, "type": kind, "run": RUN, "round": t, "sender": sender, "body": body}
    ),
    st.sampled_from(["status", "state", "start", "ack", "upload", "metrics", "downlink"]),
    st.integers(-1, 3),
    st.sampled_from(["0", "1", "coordinator", ""]),
    st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8),
)
_TOPICS = st.sampled_from(
    [T.state, T.status("0"), T.start(1), T.start(2), T.ack(1, "0"), T.up(1, "1"), T.metrics(1, "0")]
) | st.text(max_size=40).map(lambda tail: f"mqttfl/{RUN}/{tail}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_TOPICS, st.binary(max_size=200) | _ENVELOPES), max_size=12))
def test_fuzz_the_view_never_raises(messages: list[tuple[str, bytes]]) -> None:
    view = FederationView(RUN, max_upload_bytes=LIMIT)
    for index, (topic, payload) in enumerate(messages):
        assert len(view.apply(topic, payload, float(index))) <= 2
        _screen(view, float(index))
    assert view.messages == len(messages)


# --- the command -----------------------------------------------------------------------------
def test_an_unreachable_broker_fails_within_connect_timeout_with_one_line() -> None:
    began = time.monotonic()
    result = mqttfl(
        "watch",
        "--broker",
        "mqtt://127.0.0.1:1",
        "--run",
        RUN,
        env={"MQTTFL_BROKER__CONNECT_TIMEOUT_S": "2"},
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "mqttfl: error: could not connect to mqtt://127.0.0.1:1 within 2s"
    ]
    assert time.monotonic() - began < 30


def test_a_run_id_no_topic_can_hold_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["watch", "--broker", "mqtt://127.0.0.1:1", "--run", "a/b"]) == 2
    assert capsys.readouterr().err.startswith("mqttfl: error: --run 'a/b': run id 'a/b' must")


def _watch_cmd(broker: LocalBroker, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mqttfl",
        "watch",
        "--broker",
        broker.url,
        "--run",
        RUN_ID,
        *extra,
    ]


def _freeze_after_first_upload(fed: Federation, client: str) -> Callable[[Seen], None]:
    """SIGSTOP ``client`` the instant its round-1 upload reaches the broker: round 2 then
    holds still (open, one upload missing) until it is continued."""

    def on_message(seen: Seen) -> None:
        if seen.topic == f"mqttfl/{RUN_ID}/round/1/up/{client}" and client not in fed.stopped:
            fed.stop(client)

    return on_message


def _hold_round_3(fed: Federation) -> Callable[[Seen], None]:
    """Client 2 frozen after its round-1 upload (round 2 holds still until it is
    continued), and client 0 after its round-2 upload: once client 2 goes on, round 3
    stays open, missing client 0, until client 0 is continued. A snapshot taken between
    the two sees a live run however fast its rounds are."""
    freeze_2 = _freeze_after_first_upload(fed, "2")

    def on_message(seen: Seen) -> None:
        freeze_2(seen)
        if seen.topic == f"mqttfl/{RUN_ID}/round/2/up/0" and "0" not in fed.stopped:
            fed.stop("0")

    return on_message


def _watchers_subscribed(broker: LocalBroker) -> int:
    """Watchers whose last subscription (to the metrics) the broker has logged."""
    log = broker.log_path.read_text(errors="replace") if broker.log_path.exists() else ""
    last = watch_topics(Topics(RUN_ID))[-1]
    return sum(
        1
        for line in log.splitlines()
        if f" mqttfl-{RUN_ID}-watch-" in line and line.endswith(f" {last}")
    )


@pytest.mark.slow
def test_watch_once_and_piped_against_a_running_federation(
    broker: LocalBroker, tmp_path: Path
) -> None:
    piped_out = tmp_path / "piped.out"
    with open(piped_out, "w") as handle:
        piped = subprocess.Popen(
            _watch_cmd(broker), stdout=handle, stderr=subprocess.STDOUT, cwd=REPO
        )
    try:
        wait_for(
            lambda: "connected to the broker" in piped_out.read_text(), timeout=30, what="watch"
        )
        fed = Federation(
            tmp_path, broker, clients=3, rounds=3, overrides=["federation.round_timeout_s=30"]
        )
        with fed, Witness(broker.port, [f"mqttfl/{RUN_ID}/round/+/up/+"]) as witness:
            witness.on_message = _hold_round_3(fed)
            fed.start()
            fed.wait_round_started(2, timeout=90)
            once = subprocess.Popen(
                _watch_cmd(broker, "--once"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=REPO, text=True,
            )  # fmt: skip
            wait_for(lambda: _watchers_subscribed(broker) >= 2, timeout=30, what="--once")
            fed.cont("2")  # client 2 reports round 1, trains round 2: the run moves on
            out, err = once.communicate(timeout=30)
            fed.cont("0")  # round 3 goes on
            summary = fed.finish(timeout=120)
        assert piped.wait(timeout=30) == 0  # the run's status said finished
    finally:
        if piped.poll() is None:
            piped.kill()
    print(out)
    assert once.returncode == 0, err
    assert "mqttfl watch · run fedapa-csi · broker connected · clients 3 online" in out
    assert re.search(r"round [23] ", out)
    for client in ("0", "1", "2"):
        assert re.search(rf"│ {client} +│ - +│ online ", out), out
    assert re.search(r"│ 2 .*│ +\d\.\d{3} │ +\d+\.\d\d │ +[123] │", out), out  # its metrics
    assert summary["rounds_completed"] == 3

    lines = piped_out.read_text().splitlines()
    for expected in (
        "client 0 online",
        "round 1 open: 3 selected, deadline 30s",
        "round 2 closed",
        "run finished after round 3",
    ):
        assert expected in lines, lines
    assert [line for line in lines if re.fullmatch(r"client 2 uploaded round 1 \([123]/3\)", line)]
    assert [line for line in lines if re.fullmatch(r"client 2 round 3: accuracy .*", line)]
    assert "rounds closed 3 · rejected messages: none" in lines
    assert not [line for line in lines if line.startswith("rejected")]
    # The final table: client 1's round-3 metrics, and every client gone (the watcher
    # waits for their exits after the run's final status); piped, no row wraps.
    final = "\n".join(lines)
    status = r"offline \(exit\)"
    assert re.search(rf"│ 1 +│ - +│ {status} +│ uploaded +│ +\d\.\d{{3}} │ .* 3 │", final), (
        "\n".join(lines[-12:])
    )
    assert "clients 0 online, 3 offline" in final
    rows = [line for line in lines if line.startswith("│")]
    assert all(line.endswith("│") for line in rows), rows


@pytest.mark.slow
def test_watch_on_a_terminal_in_tmux(broker: LocalBroker, tmp_path: Path) -> None:
    assert shutil.which("tmux"), "tmux is missing: scripts/setup.sh installs it"
    command = shlex.join(_watch_cmd(broker)) + "; echo watch-exit=$?; sleep 600"
    tmux = Tmux("watch")
    fed = Federation(
        tmp_path, broker, clients=3, rounds=3, overrides=["federation.round_timeout_s=30"]
    )
    try:
        tmux("new-session", "-d", "-s", "watch", "-x", "120", "-y", "40", "-c", str(REPO), command)
        tmux.wait_screen("broker connected", "no run status yet", timeout=30)
        with fed, Witness(broker.port, [f"mqttfl/{RUN_ID}/round/+/up/+"]) as witness:
            witness.on_message = _freeze_after_first_upload(fed, "2")
            fed.start()
            # As a person would see it while client 2 hangs in round 2.
            screen = tmux.wait_screen("round 2 open", "uploads 2/3 · missing 2", timeout=90)
            time.sleep(1.5)  # the countdown ticks in place
            screen = tmux.screen()
            TMUX_CAPTURE.write_text(screen)
            fed.cont("2")
            fed.finish(timeout=120)
            final = tmux.wait_screen("watch-exit=", timeout=30)
    finally:
        tmux.kill()
    print(screen)
    assert re.search(r"round 2 open · deadline \d+s · uploads 2/3 · missing 2", screen)
    assert "clients 3 online, 0 offline" in screen
    assert "rounds closed 1" in screen
    for client, state in (("0", "uploaded"), ("1", "uploaded"), ("2", "waiting")):
        assert re.search(rf"│ {client} +│ - +│ online +│ {state} +│", screen), screen
    assert screen.count("mqttfl watch · run") == 1  # refreshed in place, not scrolled
    assert "watch-exit=0" in final
    assert "run finished after round 3" in final
    (tmp_path / "final-screen.txt").write_text(final)
