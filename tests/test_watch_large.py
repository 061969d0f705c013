"""`mqttfl watch` on a very large federation: a retained run state that
selects 100,000 clients (a 900 KB message) is read in one pass and drawn as a bounded
table, and each upload after it costs the same whatever the selection's size.

Before: `watch --once` on that state had not finished after 300 s, at 565 MB (the table
was rebuilt quadratically: a pass over the selection for every row). The time it takes
now is measured by `python -m tests.test_watch_large` (not asserted: a loaded machine
would make it flaky)."""

from __future__ import annotations

import io
import re
import sys
import time

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from rich.console import Console

from mqttfl.monitor.view import MAX_ROWS, FederationView, render
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from mqttfl.wire.codec import Message, encode
from mqttfl.wire.control import RoundStart, RunStatus
from tests.helpers import mqttfl

RUN = "large"
T = Topics(RUN)
CLIENTS = 100_000


def _id(i: int) -> str:
    return f"dev{i:05d}"  # 8 characters: the state is 900 KB, as in the issue


def _state(clients: int = CLIENTS, *, held: int = 0) -> bytes:
    """The retained run state of round 7, open, selecting ``clients`` ids (the first
    ``held`` already uploaded)."""
    ids = tuple(_id(i) for i in range(clients))
    start = RoundStart(7, ids, 600.0, {}, uploaded=ids[:held], announcement=1)
    return RunStatus("open", 7, start).encode(RUN)


def _upload(client: str) -> bytes:
    body = {"protos": np.zeros((2, 4), np.float32), "counts": np.ones(2, np.int64)}
    return encode(Message("upload", RUN, 7, client, body))


def _screen(view: FederationView) -> str:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render(view, 0.0))
    return out.getvalue()


def test_a_selection_of_100000_is_one_pass_and_a_bounded_table() -> None:
    view = FederationView(RUN)
    view.connection(True, 0.0)
    assert view.apply(T.state, _state(held=5_000), 0.1) == [
        "round 7 open: 100000 selected, deadline ≤600s"
    ]
    assert view.done() == 5_000
    for client in ("dev99999", "dev05000", "other"):  # the last: not selected
        view.apply(T.up(7, client), _upload(client), 1.0)
    assert view.done() == 5_002
    assert view.recent[-2] == "client dev05000 uploaded round 7 (5002/100000)"
    screen = _screen(view)
    lines = screen.splitlines()
    assert len(lines) < MAX_ROWS + 15
    assert "uploads 5002/100000 · missing dev05001, dev05002, dev05003" in screen
    assert "+94986 more" in screen  # 94,998 missing, 12 of them named
    assert re.search(r"│ dev00000 +│ - +│ - +│ uploaded +│", screen)
    assert lines[-1] == (
        f"+{CLIENTS - MAX_ROWS:,} more clients (the table shows the first {MAX_ROWS} by id)"
    )


def test_watch_once_on_a_retained_state_of_100000_selected(broker: LocalBroker) -> None:
    payload = _state()
    assert len(payload) > 890_000
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="large-state")
    publisher.connect("127.0.0.1", broker.port)
    publisher.loop_start()
    publisher.publish(T.state, payload, qos=1, retain=True).wait_for_publish(timeout=30)
    publisher.loop_stop()
    publisher.disconnect()

    began = time.monotonic()
    result = mqttfl(
        "watch", "--broker", broker.url, "--run", RUN, "--once", timeout=120, env={"COLUMNS": "200"}
    )
    print(f"watch --once: {time.monotonic() - began:.2f} s (2 s of it listening)")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "round 7 open · deadline ≤" in out
    assert "uploads 0/100000 · missing dev00000, dev00001, dev00002" in out
    assert "dev00011 +99988 more" in out
    assert len(out.splitlines()) < MAX_ROWS + 15
    assert f"+{CLIENTS - MAX_ROWS:,} more clients" in out


def main() -> None:
    """Time the view on the 100,000-id state: decode, apply, render (the goal: < 2 s)."""
    payload = _state()
    began = time.perf_counter()
    view = FederationView(RUN)
    view.connection(True, 0.0)
    view.apply(T.state, payload, 0.1)
    applied = time.perf_counter()
    screen = _screen(view)
    drawn = time.perf_counter()
    sys.stdout.write(
        f"{len(payload):,} bytes, {CLIENTS:,} selected: apply {applied - began:.3f} s, "
        f"render {drawn - applied:.3f} s, total {drawn - began:.3f} s, "
        f"{len(screen.splitlines())} lines\n"
    )


if __name__ == "__main__":
    main()


def test_a_throttled_device_is_named_in_the_header_and_its_row() -> None:
    """The coordinator lists devices past their message budget in its run state (issue
    30, item 1); the watcher says so once, in the header and in the device's row."""
    view = FederationView(RUN)
    view.connection(True, 0.0)
    start = RoundStart(3, ("0", "1", "2"), 60.0, {}, announcement=1)
    state = RunStatus("open", 3, start, throttled=("2",)).encode(RUN)
    assert "client 2 throttled" in view.apply(T.state, state, 0.1)
    assert "client 2 throttled" not in view.apply(T.state, state, 0.2)  # said once
    screen = _screen(view)
    assert "throttled: 2" in screen
    assert any(
        "online · throttled" in line or "- · throttled" in line for line in screen.splitlines()
    )
