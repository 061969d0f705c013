"""Feeding a :class:`~mqttfl.monitor.view.FederationView` from the bus: the live screen of
`mqttfl watch` and of `mqttfl run`, or plain lines.

On a TTY a ``rich`` Live view refreshes in place twice a second (and at once after the
burst of retained messages a new subscriber gets); piped, every event is one plain line.
It ends on Ctrl-C, or when the run's status says finished (a final table, exit 0).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live

from mqttfl.bus.transport import Bus, Incoming
from mqttfl.monitor.view import FederationView, render
from mqttfl.wire.topics import Topics

REFRESH_PER_S = 2.0
ONCE_LISTEN_S = 2.0  # --once: how long to listen before the snapshot
# After the run's final status, how long the clients have to say they exited (their
# 'offline' comes once they reported the last round) before the final table is drawn.
EXIT_GRACE_S = 5.0


def watch_topics(topics: Topics) -> list[str]:
    kinds = (topics.any_status, topics.state, topics.any_start, topics.any_ack, topics.any_up)
    return [*kinds, topics.any_metrics]


def _ignore(line: str) -> None:
    return None


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _take(view: FederationView, message: Incoming, emit: Callable[[str], None]) -> None:
    for line in view.apply(message.topic, message.payload, message.received):
        emit(line)


async def listen(
    view: FederationView,
    bus: Bus,
    *,
    until: float | None = None,
    emit: Callable[[str], None] = _ignore,
    paint: Callable[[], None] | None = None,
) -> None:
    """Feed the bus's messages to ``view`` until ``until`` (monotonic), or the run finishes
    and its clients have said they exited (at most EXIT_GRACE_S more); ``paint`` runs
    REFRESH_PER_S times a second."""
    next_paint = time.monotonic()
    while not view.finished or any(row.online for row in view.clients.values()):
        now = time.monotonic()
        if view.finished and until is None:
            until = now + EXIT_GRACE_S  # then every client's exit, or this long
        if until is not None and now >= until:
            return
        if paint is not None and now >= next_paint:
            paint()
            next_paint = now + 1.0 / REFRESH_PER_S
        stops = [s for s in (until, next_paint if paint else None) if s is not None]
        wait = max(min(stops) - now, 0.01) if stops else None
        try:
            message = await asyncio.wait_for(bus.incoming.get(), timeout=wait)
        except TimeoutError:
            continue
        first = view.messages == 0
        _take(view, message, emit)
        while not bus.incoming.empty():  # a burst: the retained messages of a run under way
            _take(view, bus.incoming.get_nowait(), emit)
        if paint is not None and first:  # show the live state at once, not at the next tick
            paint()
            next_paint = time.monotonic() + 1.0 / REFRESH_PER_S
    while not bus.incoming.empty():  # what arrived with the final status
        _take(view, bus.incoming.get_nowait(), emit)


async def run_watch(view: FederationView, bus: Bus, console: Console, *, once: bool) -> None:
    live = console.is_terminal and not once
    emit = _ignore if live or once else _print_line

    def on_connection(up: bool) -> None:
        for line in view.connection(up, time.monotonic()):
            emit(line)

    bus.on_connection = on_connection
    async with asyncio.TaskGroup() as group:
        bus_task = group.create_task(bus.run())
        try:
            await bus.wait_connected(timeout=bus.connect_timeout_s)
            if once:
                await listen(view, bus, until=time.monotonic() + ONCE_LISTEN_S)
            elif live:
                with Live(
                    render(view, time.monotonic(), recent=True),
                    console=console,
                    auto_refresh=False,  # painted from this loop: no thread reads the view
                    redirect_stdout=False,
                    redirect_stderr=False,
                ) as screen:

                    def paint() -> None:
                        screen.update(render(view, time.monotonic(), recent=True), refresh=True)

                    await listen(view, bus, paint=paint)
                    paint()
            else:
                await listen(view, bus, emit=emit)
        finally:
            bus_task.cancel()
    if not live:  # the live screen already shows the last frame
        console.print(render(view, time.monotonic()))
