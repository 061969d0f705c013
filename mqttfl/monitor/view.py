"""`mqttfl watch`: a live terminal view of a running federation, read only from the broker.

    mqttfl watch --broker mqtt://host:1883 --run fedapa-csi [--config C] [--once]

It subscribes to the run's status, state, start, ack, upload and metrics topics with the
credentials any client uses (``[broker]`` or ``MQTTFL_BROKER__*``; `broker init` writes a
read-only ``watch`` identity) and never publishes. Every message is hostile until a
reader of :mod:`mqttfl.wire.control` has decoded it; one that fails is counted by its
reason and the view goes on. Uploads are only counted: their envelope is checked (type,
run, round and sender against the topic), never their payload. The watcher receives
every upload to count it, so it costs the broker what one more coordinator would.

:class:`FederationView` is the whole state, changed only by :meth:`FederationView.apply`
(and :meth:`~FederationView.connection`) and drawn by :func:`render`; neither touches the
network, so tests feed them by hand. The bus feeds them in
:mod:`mqttfl.monitor.live`. Each message costs the same whatever
the selection's size, and a drawing one pass over it: the table shows the first
``MAX_ROWS`` clients by id and a line counts the rest (100,000 selected: 0.4 s).

A deadline is computed here, from a start's relative ``timeout_s`` and the time it
arrived. The run status is retained: one that arrives right after connecting may be an
old copy, so a deadline known only from it is an upper bound and shown as ``≤``.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mqttfl.errors import WireError
from mqttfl.monitor.buffered import BufferWatch
from mqttfl.monitor.text import MAX_NAMES, clean, countdown, first_names, status_site
from mqttfl.privacy.accountant import PrivacySettings
from mqttfl.wire.control import (
    Online,
    RoundStart,
    RunPhase,
    RunStatus,
    read_ack,
    read_envelope,
    read_metrics,
    read_run_status,
    read_start,
    read_status,
)
from mqttfl.wire.ids import client_order
from mqttfl.wire.topics import (
    AckTopic,
    LeaseTopic,
    ManifestTopic,
    MetricsTopic,
    StartTopic,
    StateTopic,
    StatusTopic,
    Topics,
    UploadTopic,
)

RETAINED_WINDOW_S = 1.0  # a run status this soon after (re)connecting may be the retained copy
KEEP_ROUNDS = 3  # per-round upload and ack tallies: the current round and its neighbours
RECENT_EVENTS = 6  # event lines under the live table
MAX_ROWS = 50  # clients in the table, the first by id; a line counts the others


@dataclass
class ClientRow:
    online: bool | None = None  # None: no status seen, or the retained one was cleared
    site: str | None = None
    reason: str = ""  # why it went offline
    accuracy: float | None = None
    mae: float | None = None
    metrics_round: int = 0
    uploads: int = 0  # seen on the bus, for [privacy]'s ε


@dataclass
class FederationView:
    """What the broker has shown of one run; ``received`` times are ``time.monotonic()``."""

    run_id: str
    max_upload_bytes: int | None = None
    privacy: PrivacySettings | None = None  # the run's [privacy]: an ε column
    buffer: BufferWatch | None = None  # federation.mode = "buffered": versions, staleness
    phase: RunPhase | Literal["unknown"] = "unknown"
    round: int = 0
    selected: tuple[str, ...] = ()
    held: tuple[str, ...] = ()  # uploads the coordinator says it holds (a re-announcement)
    deadline: float | None = None
    deadline_exact: bool = True
    closed_through: int = 0  # rounds close in order: 1..closed_through are closed
    connected: bool = False
    connected_at: float = float("-inf")
    clients: dict[str, ClientRow] = field(default_factory=dict)
    uploads: dict[int, Counter[str]] = field(default_factory=dict)  # round -> payloads
    acks: dict[int, Counter[str]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    #: devices past their message budget (the coordinator's ``client.throttled``)
    throttled: frozenset[str] = frozenset()
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    messages: int = 0
    _announced: tuple[int, int, int] | None = None
    topics: Topics = field(init=False, repr=False)
    # The selection as a set, and the selected clients whose upload is in: kept up to date
    # one message at a time, so no message costs a pass over a selection of 100,000.
    _chosen: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    _done: set[str] = field(default_factory=set, init=False, repr=False)
    # per round, the uploads a re-announcement said the coordinator holds (not on the wire)
    _held_in: dict[int, frozenset[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.topics = Topics(self.run_id)  # WireError for a run id no topic can hold

    # --- queries -------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.phase == "finished"

    def uploaded(self) -> set[str]:
        """Clients whose upload for the current round is in (seen, or held by the coordinator)."""
        return set(self.uploads.get(self.round, ())) | set(self.held)

    def done(self) -> int:
        """Selected clients whose upload for the current round is in."""
        return len(self._done)

    def is_selected(self, client: str) -> bool:
        return client in self._chosen

    def has_uploaded(self, client: str) -> bool:
        """A selected client whose upload for the current round is in."""
        return client in self._done

    def missing(self, first: int | None = None) -> list[str]:
        """Selected clients whose upload is not in, in id order (only the ``first`` few)."""
        waiting = (c for c in self.selected if c not in self._done)
        if first is None:
            return sorted(waiting, key=client_order)
        return heapq.nsmallest(first, waiting, key=client_order)

    def client_ids(self, first: int | None = None) -> list[str]:
        """Every client seen or selected, in id order (only the ``first`` few)."""
        ids: Iterable[str] = self._chosen.union(self.clients)
        if first is None:
            return sorted(ids, key=client_order)
        return heapq.nsmallest(first, ids, key=client_order)

    def client_count(self) -> int:
        return len(self._chosen.union(self.clients))

    # --- updates -------------------------------------------------------------------------
    def connection(self, up: bool, at: float) -> list[str]:
        self.connected = up
        if up:
            self.connected_at = at
        event = "connected to the broker" if up else "broker connection lost, reconnecting"
        self.recent.append(event)
        return [event]

    def apply(self, topic: str, payload: bytes, received: float) -> list[str]:
        """Take one message; return the event lines it makes. Never raises: a message that
        does not decode is counted in ``rejected`` by its reason."""
        self.messages += 1
        try:
            events = self._apply(topic, payload, received)
        except WireError as exc:
            self.rejected[exc.reason] += 1
            events = [f"rejected {self._short(topic)}: {exc.reason}"]
        self.recent.extend(events)
        return events

    def _short(self, topic: str) -> str:
        prefix = self.topics.base + "/"
        return clean(topic[len(prefix) :] if topic.startswith(prefix) else topic)

    def _apply(self, topic: str, payload: bytes, received: float) -> list[str]:
        run = self.run_id
        match self.topics.parse(topic):
            case StatusTopic(client):
                return self._status(client, payload)
            case StateTopic() if payload:
                return self._run_status(read_run_status(payload, run_id=run), received)
            case StateTopic() | LeaseTopic() | ManifestTopic():
                return []  # a cleared run state; the lease and manifest: not the run's progress
            case StartTopic(t):
                return self._open(read_start(payload, run_id=run, round=t), received, exact=True)
            case AckTopic(t, client):
                read_ack(payload, run_id=run, round=t, client=client)
                self._tally(self.acks, t, client)
                return []
            case UploadTopic(t, client):
                return self._upload(t, client, payload)
            case MetricsTopic(t, client):
                return self._metrics(payload, t, client)
            case other:
                raise WireError("topic", f"the watcher does not read {other.kind} messages")

    def _row(self, client: str) -> ClientRow:
        return self.clients.setdefault(client, ClientRow())

    def _status(self, client: str, payload: bytes) -> list[str]:
        if not payload:  # a cleared retained status
            if client in self.clients:
                self.clients[client].online = None
            return []
        status = read_status(payload, run_id=self.run_id, client=client)
        row = self._row(client)
        was = row.online
        if isinstance(status, Online):
            row.online, row.reason, row.site = True, "", status_site(status)
            where = f" at {row.site}" if row.site else ""
            return [] if was is True else [f"client {client} online{where}"]
        row.online, row.reason = False, clean(status.reason)
        why = f" ({row.reason})" if row.reason else ""
        return [] if was is False else [f"client {client} offline{why}"]

    def _run_status(self, status: RunStatus, received: float) -> list[str]:
        exact = received - self.connected_at > RETAINED_WINDOW_S
        events = [f"client {c} throttled" for c in status.throttled if c not in self.throttled]
        self.throttled = self.throttled | frozenset(status.throttled)
        t = status.round
        if t < self.round:
            return events  # overtaken by what we already saw
        if status.start is not None:
            return events + self._open(status.start, received, exact=exact)
        if status.phase in ("closed", "finished") and t > self.closed_through:
            self.closed_through = t
            events.append(f"round {t} closed")
        if status.phase == "finished" and self.phase != "finished":
            events.append(f"run finished after round {t}")
        if status.phase == "waiting" and self.phase != "waiting":
            events.append("waiting for clients")
        changed = t != self.round
        self.phase, self.round, self.deadline = status.phase, t, None
        if changed:
            self._choose((), ())
        self._prune()
        return events

    def _open(self, start: RoundStart, received: float, *, exact: bool) -> list[str]:
        t = start.round
        if t < self.round or (t == self.round and self.phase in ("closed", "finished")):
            return []  # the start of a round already closed
        deadline = received + float(start.timeout_s)
        key = (t, start.attempt, start.announcement)
        if key == self._announced:  # the same announcement again (run status, then start)
            if exact and not self.deadline_exact:
                self.deadline, self.deadline_exact = deadline, True
            return []
        self._announced = key
        self.phase, self.round = "open", t
        self._choose(start.selected, start.uploaded)
        self.deadline, self.deadline_exact = deadline, exact
        self.closed_through = max(self.closed_through, t - 1)
        self._prune()
        attempt = f" (attempt {start.attempt})" if start.attempt > 1 else ""
        return [
            f"round {t} open{attempt}: {len(start.selected)} selected, "
            f"deadline {'' if exact else '≤'}{start.timeout_s:.0f}s"
        ]

    def _upload(self, t: int, client: str, payload: bytes) -> list[str]:
        read_envelope(  # the envelope only, bounded: the coordinator checks the body
            payload, "upload", self.run_id, sender=client, round=t, max_bytes=self.max_upload_bytes
        )
        if self.buffer is not None:  # before the tally, which keeps only nearby rounds
            current = self.round + (self.phase != "open")
            self.buffer.upload(client, t, current, self.closed_through)
        kept = self._tally(self.uploads, t, client)
        if kept and self.uploads[t][client] == 1 and client in self.clients:  # a re-send: once
            self.clients[client].uploads += 1  # no row for an id only an upload topic named
        if not kept or t != self.round:
            return [f"client {client} uploaded round {t} (round {self.round} is current)"]
        if client in self._chosen:
            self._done.add(client)
        return [f"client {client} uploaded round {t} ({self.done()}/{len(self.selected)})"]

    def _choose(self, selected: tuple[str, ...], held: tuple[str, ...]) -> None:
        """The current round's selection: what is already in is counted here, once per
        announcement; then one upload at a time."""
        self.selected, self.held = selected, held
        if held:
            self._held_in[self.round] = frozenset(held)
        self._chosen = frozenset(selected)
        seen = self.uploads.get(self.round, Counter())
        self._done = {c for c in chain(seen, held) if c in self._chosen}

    def _metrics(self, payload: bytes, t: int, client: str) -> list[str]:
        metrics = read_metrics(payload, run_id=self.run_id, round=t, client=client)
        row = self._row(client)
        if t < row.metrics_round or self._sat_out(t, client):
            return []
        repeat = t == row.metrics_round
        row.accuracy = float(metrics.values["accuracy"])
        row.mae = float(metrics.values["mae"])
        row.metrics_round = t
        if repeat:
            return []
        return [f"client {client} round {t}: accuracy {row.accuracy:.3f}, MAE {row.mae:.2f}"]

    def _sat_out(self, t: int, client: str) -> bool:
        """Round ``t`` had uploads, none of them ``client``'s: it evaluates the round's
        downlink (a client back from a dropout catches up so) without having trained in
        it. Its row keeps the figures of the rounds it trained in. Unknown rounds (before
        this watcher came, or long past) and buffered runs are taken as they come."""
        seen = self.uploads.get(t)
        if self.buffer is not None or not seen or seen[client]:
            return False
        return client not in self._held_in.get(t, ())

    def _keep(self, t: int) -> bool:
        """Tallies are kept for the rounds around the current one (any, before the first
        run status): a flood of other round numbers cannot grow them."""
        return self.round == 0 or abs(t - self.round) <= 1

    def _tally(self, store: dict[int, Counter[str]], t: int, client: str) -> bool:
        if not self._keep(t):
            return False
        store.setdefault(t, Counter())[client] += 1
        self._prune()
        return True

    def _prune(self) -> None:
        for store in (self.uploads, self.acks, self._held_in):
            for t in [t for t in store if not self._keep(t)]:
                del store[t]
            while len(store) > KEEP_ROUNDS:
                del store[min(store)]


# --- drawing -------------------------------------------------------------------------------
def _round_line(view: FederationView, now: float) -> str:
    t = view.round
    match view.phase:
        case "open":
            done, selected = view.done(), len(view.selected)
            left = countdown(view.deadline, now, exact=view.deadline_exact)
            return (
                f"round {t} open · deadline {left} · uploads {done}/{selected}"
                f" · missing {first_names(view.missing(first=MAX_NAMES), selected - done)}"
            )
        case "closed":
            return f"round {t} closed · waiting for round {t + 1}"
        case "finished":
            return f"run finished after round {t}"
        case "waiting":
            return "waiting for clients to join"
        case "unknown":
            return "no run status yet"


def _in_round(view: FederationView, client: str) -> Text:
    if not view.is_selected(client) or view.phase not in ("open", "closed", "finished"):
        return Text("-")
    if view.has_uploaded(client):
        return Text("uploaded", style="green")
    if view.phase != "open":
        return Text("missed", style="red")
    if view.acks.get(view.round, Counter())[client]:
        return Text("training", style="yellow")
    return Text("waiting")


def _status_cell(row: ClientRow, *, throttled: bool = False) -> Text:
    mark = " · throttled" if throttled else ""
    if row.online is None:
        return Text("-" + mark)
    if row.online:
        return Text("online" + mark, style="yellow" if throttled else "green")
    return Text((f"offline ({row.reason})" if row.reason else "offline") + mark, style="red")


def render(view: FederationView, now: float, *, recent: bool = False) -> RenderableType:
    """The view as a header, a table of clients and (``recent``) the last events."""
    online = sum(1 for row in view.clients.values() if row.online is True)
    offline = sum(1 for row in view.clients.values() if row.online is False)
    broker = "connected" if view.connected else "not connected"
    rejected = ", ".join(f"{reason} {n}" for reason, n in view.rejected.most_common()) or "none"
    if view.throttled:
        named = sorted(view.throttled)
        more = f" +{len(named) - 5} more" if len(named) > 5 else ""
        rejected += f" · throttled: {', '.join(clean(c) for c in named[:5])}{more}"
    header = Text.assemble(
        ("mqttfl watch", "bold"),
        f" · run {view.run_id} · broker {broker} · clients {online} online, {offline} offline\n",
        (_round_line(view, now), "bold"),
        f"\nrounds closed {view.closed_through} · rejected messages: {rejected}",
        f"\n{view.buffer.line(view.closed_through)}" if view.buffer else "",
    )
    table = Table()
    for name in ("client", "site", "status", f"round {view.round}" if view.round else "round"):
        table.add_column(name)
    for name in ("accuracy", "MAE", "eval round", *(("ε",) if view.privacy else ())):
        table.add_column(name, justify="right")
    if view.buffer:
        table.add_column("staleness", justify="right")
    for client in view.client_ids(first=MAX_ROWS):
        row = view.clients.get(client) or ClientRow()
        measured = row.accuracy is not None and row.mae is not None
        table.add_row(
            Text(client),
            Text(row.site or "-"),
            _status_cell(row, throttled=client in view.throttled),
            _in_round(view, client),
            Text(f"{row.accuracy:.3f}" if row.accuracy is not None else "-"),
            Text(f"{row.mae:.2f}" if row.mae is not None else "-"),
            Text(str(row.metrics_round) if measured else "-"),
            *([Text(f"{view.privacy.spent(row.uploads):.2f}")] if view.privacy else []),
            *([Text(view.buffer.cell(client))] if view.buffer else []),
        )
    parts: list[RenderableType] = [header, table]
    hidden = view.client_count() - MAX_ROWS
    if hidden > 0:
        parts.append(Text(f"+{hidden:,} more clients (the table shows the first {MAX_ROWS} by id)"))
    if recent and view.recent:
        parts.append(Text("\n".join(view.recent), style="dim"))
    return Group(*parts)
