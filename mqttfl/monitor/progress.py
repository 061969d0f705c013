"""What `mqttfl run` shows while it works: the live view of `mqttfl watch`, then a bar.

On a terminal, :class:`RunMonitor` draws :func:`mqttfl.monitor.view.render` (rounds,
clients, uploads, accuracy so far) in place, with a line of its own: rounds done of the
config's, seconds per round and the time left. It reads the run from the broker as
`mqttfl watch` does, with the read-only ``watch`` identity the launcher's broker was
initialised with, in a thread of its own (its own asyncio loop), so the launcher's wait
for its children goes on beside it. Piped (or ``--plain``) it writes one line per
closed round instead. :class:`ReferenceProgress` then shows the Local reference's
training: a bar with an ETA on a terminal, one line per round otherwise.

Nothing here decides anything: a view that cannot connect shows that, and the run goes
on (its table comes from the coordinator's summary, not from this view). A view the
broker refuses stops, with a line in the launcher's log only: the run's own processes
meet the same refusal, and the launcher reports theirs.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus
from mqttfl.errors import first_mqttfl_error
from mqttfl.logs import get_logger
from mqttfl.monitor.live import REFRESH_PER_S, listen, watch_topics
from mqttfl.monitor.view import FederationView, render

POLL_S = 0.25  # how often the monitor thread looks at its stop flag


def _seconds(value: float) -> str:
    value = max(0.0, value)
    return f"{value:.0f} s" if value < 90 else f"{value // 60:.0f} min {value % 60:02.0f} s"


class RoundClock:
    """Seconds per round and time left, from the times rounds closed."""

    def __init__(self, total: int, began: float) -> None:
        self.total = total
        self.began = began
        self.closed: dict[int, float] = {}

    def close(self, t: int, at: float) -> None:
        self.closed.setdefault(t, at)

    @property
    def done(self) -> int:
        return max(self.closed, default=0)

    def per_round(self) -> float | None:
        """Mean seconds per round since the first closed one (the start costs apart)."""
        if len(self.closed) < 2:
            return None
        first, last = min(self.closed), max(self.closed)
        return (self.closed[last] - self.closed[first]) / (last - first)

    def left(self) -> float | None:
        rate = self.per_round()
        return None if rate is None else rate * (self.total - self.done)

    def line(self) -> str:
        rate, left = self.per_round(), self.left()
        parts = [f"round {self.done}/{self.total} done"]
        if rate is not None and left is not None:
            parts += [f"{rate:.1f} s/round", f"about {_seconds(left)} left"]
        return " · ".join(parts)


def mean_accuracy(view: FederationView) -> tuple[float, int] | None:
    """The clients' mean of their latest accuracy, and the newest round it comes from."""
    rows = [row for row in view.clients.values() if row.accuracy is not None]
    if not rows:
        return None
    accuracy = sum(float(row.accuracy or 0.0) for row in rows) / len(rows)
    return accuracy, max(row.metrics_round for row in rows)


def round_line(view: FederationView, clock: RoundClock, t: int) -> str:
    """The plain line of a closed round."""
    uploads = f"{len(view.uploaded() & set(view.selected))}/{len(view.selected)} uploads"
    if view.buffer is not None:  # buffered: what filled the buffer, not one round's uploads
        uploads = f"buffer {view.buffer.fill}/{view.buffer.buffer_size}"
    parts = [f"round {t}/{clock.total} closed", uploads]
    accuracy = mean_accuracy(view)
    if accuracy is not None:
        parts.append(f"mean accuracy {accuracy[0]:.3f} (evaluated after round {accuracy[1]})")
    rate, left = clock.per_round(), clock.left()
    if rate is not None and left is not None:
        parts.append(f"{rate:.1f} s/round, about {_seconds(left)} left")
    return " · ".join(parts)


class RunMonitor:
    """The live view (or plain lines) of a federation the launcher runs; see the module."""

    def __init__(
        self,
        view: FederationView,
        address: BrokerAddress,
        credentials: Credentials,
        *,
        rounds: int,
        console: Console,
        live: bool,
        keepalive_s: int = 15,
    ) -> None:
        self.view = view
        self.console = console
        self.live = live
        self.clock = RoundClock(rounds, time.monotonic())
        self.bus = Bus(
            address,
            identifier=f"mqttfl-{view.run_id}-watch-run-{secrets.token_hex(4)}",
            subscriptions=watch_topics(view.topics),
            credentials=credentials,
            keepalive_s=keepalive_s,
            connect_timeout_s=30.0,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="mqttfl-run-view", daemon=True)

    def __enter__(self) -> RunMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def frame(self) -> RenderableType:
        now = time.monotonic()
        return Group(render(self.view, now, recent=True), Text(self.clock.line(), style="bold"))

    def _emit(self, line: str) -> None:
        """Rounds close on their closed status, or (if that was missed) when the next opens."""
        words = line.replace(":", " ").split()
        if line.startswith("round ") and len(words) > 2 and words[2] in ("closed", "open"):
            closed = int(words[1]) - (words[2] == "open")
        elif line.startswith("run finished after round "):
            closed = int(words[-1])
        else:
            return
        if closed >= 1 and closed not in self.clock.closed:
            self.clock.close(closed, time.monotonic())
            if not self.live:
                self._write(round_line(self.view, self.clock, closed))

    def _write(self, line: str) -> None:
        self.console.file.write(line + "\n")
        self.console.file.flush()

    def _main(self) -> None:
        try:
            asyncio.run(self._watch())
        except Exception as exc:
            error = first_mqttfl_error(exc)
            if error is None:
                raise
            get_logger().warning("view.stopped", error=str(error))

    async def _watch(self) -> None:
        def on_connection(up: bool) -> None:
            self.view.connection(up, time.monotonic())

        self.bus.on_connection = on_connection
        async with asyncio.TaskGroup() as group:
            task = group.create_task(self.bus.run())
            try:
                if self.live:
                    with Live(
                        self.frame(),
                        console=self.console,
                        auto_refresh=False,
                        redirect_stdout=False,
                        redirect_stderr=False,
                        transient=False,
                    ) as screen:

                        def paint() -> None:
                            screen.update(self.frame(), refresh=True)

                        await self._listen(paint)
                        paint()
                else:
                    await self._listen(None)
            finally:
                task.cancel()

    async def _listen(self, paint: Callable[[], None] | None) -> None:
        while not self._stop.is_set() and not self.view.finished:
            await listen(
                self.view,
                self.bus,
                until=time.monotonic() + POLL_S,
                emit=self._emit,
                paint=paint,
            )


class ReferenceProgress:
    """Progress of the Local reference's training: ``advance(client, round)`` from its
    worker threads; a bar with an ETA on a terminal, one line per round otherwise."""

    def __init__(self, clients: int, rounds: int, *, console: Console, live: bool) -> None:
        self.clients, self.rounds = clients, rounds
        self.console = console
        self.live = live
        self.began = time.monotonic()
        self._lock = threading.Lock()
        self._done: dict[str, int] = {}
        self._printed = 0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Callable[[str, int], None]:
        if self.live:
            self._bar = Progress(
                TextColumn("local reference (each client alone)"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("client-rounds ·"),
                TimeElapsedColumn(),
                TextColumn("· left"),
                TimeRemainingColumn(),
                console=self.console,
                refresh_per_second=REFRESH_PER_S,
            )
            self._bar.start()
            self._task = self._bar.add_task("reference", total=self.clients * self.rounds)
        return self.advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, client: str, t: int) -> None:
        with self._lock:
            self._done[client] = t
            if self._bar is not None and self._task is not None:
                self._bar.advance(self._task)
                return
            finished = min(self._done.values()) if len(self._done) == self.clients else 0
            if finished > self._printed:
                self._printed = finished
                took = time.monotonic() - self.began
                left = took / finished * (self.rounds - finished)
                self.console.file.write(
                    f"local reference: round {finished}/{self.rounds} · {_seconds(took)}, "
                    f"about {_seconds(left)} left\n"
                )
                self.console.file.flush()


def console_for(stream: TextIO = sys.stdout, *, plain: bool) -> tuple[Console, bool]:
    """The console `mqttfl run` writes to, and whether it draws live (a terminal, no --plain)."""
    console = Console(file=stream, highlight=False)
    return console, console.is_terminal and not plain
