"""Real `mqttfl run` federations for the benchmarks, with optional byte counting.

:func:`run_federation` starts its own Mosquitto on 127.0.0.1, optionally a
:class:`Sniffer` (an extra MQTT subscriber that sizes every upload and downlink as it
crossed the broker) and a :class:`CountingProxy` between the client processes and the
broker (every byte each client sent and received, MQTT framing included), then runs
:class:`mqttfl.launch.local.LocalFederation` (coordinator + one OS process per
client) to the end. One federation at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import log, read_jsonl

if TYPE_CHECKING:
    from mqttfl.engine.documents import RunSummary


class CountingProxy:
    """A loopback TCP relay that counts the bytes each way (client->server is "up")."""

    def __init__(self, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self.up = 0
        self.down = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="counting-proxy")

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, self.host, 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str
    ) -> None:
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                if direction == "up":
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(RuntimeError):
                writer.close()

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(
                self.host, self.target_port
            )
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            self._pipe(client_reader, server_writer, "up"),
            self._pipe(server_reader, client_writer, "down"),
        )


@dataclass
class Sniffer:
    """An MQTT subscriber sizing every upload and downlink of a run as the broker saw it."""

    port: int
    records: list[dict[str, Any]] = field(default_factory=list)

    def __enter__(self) -> Sniffer:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-sniffer")
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", self.port)
        self._client.subscribe([("mqttfl/+/round/+/up/+", 1), ("mqttfl/+/round/+/down/+", 1)])
        self._client.loop_start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)
        self._client.loop_stop()
        self._client.disconnect()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        from mqttfl.wire import decode

        payload = bytes(message.payload)
        if not payload:
            return  # a cleared retained broadcast
        parts = message.topic.split("/")
        body = decode(payload).body
        self.records.append(
            {
                "kind": parts[4],
                "round": int(parts[3]),
                "client": parts[5],
                "topic_bytes": len(message.topic),
                "bytes": len(payload),
                "array_bytes": _content_bytes(body),
                "fields": sorted(str(k) for k in body),
            }
        )


def _content_bytes(value: Any) -> int:
    """Raw bytes of the content: array buffers, plus 8 per scalar and UTF-8 of strings."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(_content_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_content_bytes(v) for v in value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool) or value is None:
        return 1
    return 8


@dataclass
class FederationResult:
    out: Path
    summary: RunSummary
    wall_s: float
    sniffed: list[dict[str, Any]]
    proxy: dict[str, int] | None


def run_federation(
    config: str,
    overrides: list[str],
    out: Path,
    *,
    sniff: bool = False,
    count_client_bytes: bool = False,
) -> FederationResult:
    """Run one whole local federation (`mqttfl run` in-process) and return its outputs."""
    from mqttfl.config import load_config
    from mqttfl.logs import configure_logging
    from mqttfl.provisioning.local_broker import LocalBroker

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = load_config(config, overrides)
    configure_logging(out / "logs" / "launcher.jsonl", level="info", console_level="warning")
    sniffer: Sniffer | None = None
    proxy: CountingProxy | None = None
    with LocalBroker(out / "broker") as broker:
        try:
            if sniff:
                sniffer = Sniffer(broker.port).__enter__()
            if count_client_bytes:
                proxy = CountingProxy(broker.port).__enter__()
            federation = _Federation(
                cfg,
                config,
                overrides,
                out,
                broker.url,
                client_broker_url=f"mqtt://127.0.0.1:{proxy.port}" if proxy else None,
            )
            began = time.monotonic()
            summary = federation.run()
            wall = time.monotonic() - began
        finally:
            if sniffer is not None:
                sniffer.__exit__(None, None, None)
            if proxy is not None:
                proxy.__exit__(None, None, None)
    log(
        f"federation {cfg.run_id} ({cfg.method}, {cfg.federation.num_clients} clients, {cfg.rounds} rounds) "
        f"took {wall:.1f} s"
    )
    return FederationResult(
        out,
        summary,
        wall,
        sniffer.records if sniffer else [],
        {"up": proxy.up, "down": proxy.down, "connections": proxy.connections} if proxy else None,
    )


def _federation_class() -> type:
    from mqttfl.launch.local import LocalFederation

    class Federation(LocalFederation):
        """Clients may reach the broker through another URL (the counting proxy)."""

        def __init__(self, *args: Any, client_broker_url: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.client_broker_url = client_broker_url

        def command(self, role: str, *extra: str) -> list[str]:
            cmd: list[str] = super().command(role, *extra)
            # "clients": since the launcher forks every client from one process
            if role in ("client", "clients") and self.client_broker_url:
                cmd[cmd.index("--broker") + 1] = self.client_broker_url
            return cmd

    return Federation


def _Federation(*args: Any, **kwargs: Any) -> Any:
    return _federation_class()(*args, **kwargs)


# --- reading a finished run -------------------------------------------------------------------
def round_timeline(out: Path) -> list[dict[str, Any]]:
    """Per round, from the logs: cycle time, slowest client's training, coordinator turnaround.

    cycle: round.started(t) -> round.started(t+1) (the last round: -> round.closed);
    slowest training: the largest ``seconds`` of the clients' ``upload.sent`` (local
    training, prototypes or weights, encode and publish); turnaround: the coordinator's
    last ``upload.accepted`` -> the next round.started. Also each client's evaluation of
    the previous round (coordinator's round.closed(t-1) -> the client's round.evaluated(t-1))
    plus its training, whose maximum over clients is all the compute on the round's path.
    """
    from benchmarks.common import event_time

    logs = out / "logs"
    coordinator = read_jsonl(logs / "coordinator.jsonl")
    started = {e["round"]: event_time(e) for e in coordinator if e.get("event") == "round.started"}
    closed = {e["round"]: event_time(e) for e in coordinator if e.get("event") == "round.closed"}
    accepted: dict[int, float] = {}
    for e in coordinator:
        if e.get("event") == "upload.accepted":
            accepted[e["round"]] = max(accepted.get(e["round"], 0.0), event_time(e))
    training: dict[int, list[float]] = defaultdict(list)
    # per round t: each client's evaluation of round t-1 (downlinks out -> round.evaluated)
    # plus its training of round t, i.e. all the compute on that client's path in cycle t
    busy: dict[int, list[float]] = defaultdict(list)
    for path in sorted(logs.glob("client-*.jsonl")):
        events = read_jsonl(path)
        evaluated = {
            e["round"]: event_time(e) for e in events if e.get("event") == "round.evaluated"
        }
        for e in events:
            if e.get("event") == "upload.sent" and "seconds" in e:
                t = e["round"]
                training[t].append(float(e["seconds"]))
                before = (
                    max(0.0, evaluated[t - 1] - closed[t - 1])
                    if t - 1 in evaluated and t - 1 in closed
                    else 0.0
                )
                busy[t].append(before + float(e["seconds"]))
    rows = []
    for t in sorted(started):
        end = started.get(t + 1, closed.get(t))
        if end is None or not training.get(t):
            continue
        row = {
            "round": t,
            "cycle_s": end - started[t],
            "slowest_training_s": max(training[t]),
            "median_training_s": sorted(training[t])[len(training[t]) // 2],
            "clients": len(training[t]),
        }
        row["ratio"] = row["cycle_s"] / row["slowest_training_s"]
        row["slowest_eval_plus_training_s"] = max(busy[t])
        row["ratio_vs_eval_plus_training"] = row["cycle_s"] / max(busy[t])
        if t in accepted and t + 1 in started:
            row["coordinator_turnaround_s"] = started[t + 1] - accepted[t]
        rows.append(row)
    return rows
