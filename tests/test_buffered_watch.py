"""`mqttfl watch` on a buffered run (federation.mode = "buffered"): versions, the buffer's
fill and each client's staleness, from hand-made messages on the pure view."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from mqttfl.config import FederationConfig, RunConfig
from mqttfl.engine.documents import RunSummary
from mqttfl.evaluation.table import format_table
from mqttfl.monitor.buffered import BufferWatch, buffer_watch
from mqttfl.monitor.view import FederationView, render
from mqttfl.wire import Topics
from mqttfl.wire.codec import Message, encode
from mqttfl.wire.control import Online, RoundStart, RunStatus
from mqttfl.wire.schemas import ClientInfo

RUN = "r1"
T = Topics(RUN)


def _upload(t: int, client: str) -> bytes:
    return encode(Message("upload", RUN, t, client, {"prototypes": np.zeros((2, 4), np.float32)}))


def _screen(view: FederationView) -> str:
    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(render(view, 100.0))
    return out.getvalue()


def _row(screen: str, client: str) -> str:
    return next(line for line in screen.splitlines() if line.startswith(f"│ {client} "))


def _open(view: FederationView, t: int) -> None:
    start = RoundStart(t, ("0", "1", "2"), 30.0, {}, announcement=t)
    view.apply(T.state, RunStatus("open", t, start).encode(RUN), 100.0)


def test_the_view_shows_versions_buffer_fill_and_staleness_per_client() -> None:
    view = FederationView(RUN, buffer=BufferWatch(buffer_size=2, max_staleness=3))
    for c in "012":
        info = ClientInfo(c, "tiny", (0, 1), 40, (24, 52))
        view.apply(T.status(c), Online(info).encode(RUN), 100.0)
    _open(view, 1)
    view.apply(T.up(1, "0"), _upload(1, "0"), 100.0)
    view.apply(T.up(1, "1"), _upload(1, "1"), 100.0)
    view.apply(T.state, RunStatus("closed", 1).encode(RUN), 100.0)
    _open(view, 2)
    view.apply(T.up(2, "0"), _upload(2, "0"), 100.0)
    _open(view, 3)  # (its close status was not seen: the start says round 2 closed)
    view.apply(T.up(1, "2"), _upload(1, "2"), 100.0)  # client 2's round-1 work, 2 versions late
    view.apply(T.up(1, "2"), _upload(1, "2"), 100.0)  # a repeat counts once
    screen = _screen(view)
    assert "versions 2 · buffer 1/2" in screen
    assert "0:3 2:1" in screen  # three fresh uploads, one two versions stale
    assert _row(screen, "2").rstrip("│ ").endswith("2")
    assert _row(screen, "0").rstrip("│ ").endswith("0")


def test_synchronous_runs_show_no_buffer() -> None:
    assert buffer_watch(RunConfig()) is None
    fed = FederationConfig(mode="buffered", buffer_size=3, max_staleness=5)
    assert buffer_watch(RunConfig(federation=fed)) == BufferWatch(3, 5)
    view = FederationView(RUN)
    assert "staleness" not in _screen(view)


def test_the_final_table_says_how_stale_the_aggregated_uploads_were() -> None:
    summary = {
        "method": "fedavg",
        "run_id": RUN,
        "rounds_completed": 4,
        "clients": {
            "0": {"accuracy": 0.5, "f1": 0.5, "mae": 1.0, "kb_sent": 1.0, "kb_received": 2.0}
        },
        "mean": {"accuracy": 0.5, "f1": 0.5, "mae": 1.0},
        "comm": {"up_bytes_per_client_round": 10.0, "down_bytes_per_client_round": 20.0},
        "rejections": {"too_stale": 2},
        "buffered": {
            "versions": 4,
            "buffer_size": 2,
            "max_staleness": 3,
            "staleness_weighting": "fedbuff",
            "staleness": {"0": 6, "3": 2},
            "too_stale": 2,
        },
    }
    line = format_table(RunSummary.model_validate(summary)).splitlines()[-1]
    assert line.startswith("buffered: 4 versions of 2 uploads")
    assert "τ=0: 6, τ=3: 2 (mean τ 0.75)" in line
    assert line.endswith("2 refused as too stale")
