"""The real coordinator under a torch-free load: the harness of the fan-in and overhead benchmarks.

One process (this one) runs :class:`mqttfl.nodes.coordinator.Coordinator` with FedAPA
(C=21, d=256), logging to a JSON file at debug level exactly as ``mqttfl coordinator``
does; a second process runs the load client :mod:`mqttfl.testing.loadclient` with N
sessions, each subscribed to everything a real client subscribes to; a throwaway
Mosquitto sits between them on 127.0.0.1. The coordinator is instrumented from outside
(a subclass that only records ``time.monotonic()``; Linux's monotonic clock is shared by
all processes, so the load process's marks compare directly):

- ``accepted``: when each upload of a round has passed the upload gate (decode + checks),
- ``aggregated``: around ``server.aggregate``; ``checkpoint_s``: the journal's checkpoint write,
- ``downlinks_published``: when the last downlink of the round was acknowledged by the broker,
- ``start_published``: when the next round's start message was acknowledged.

``raw_fanin`` is the reference without mqttfl: one plain aiomqtt subscriber that only
counts the uploads (no decoding, no validation), driven by the same load process.
``raw_fanout`` is the downlinks' reference: the same plain client publishing each round's
FedAPA downlinks, encoded beforehand, to the same load sessions (the wire's floor under
the coordinator's turnaround).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, WORK, log

CLASSES, DIM = 21, 256  # the default job: 21 crowd-count classes, d=256

LOADCLIENT = [sys.executable, "-m", "mqttfl.testing.loadclient"]


def _start_load(
    broker_url: str, overrides: list[str], n: int, classes_each: int, out: Path, log_file: Path
) -> subprocess.Popen[bytes]:
    """The real load client (mqttfl.testing.loadclient): N sessions, each subscribed to
    everything a real client subscribes to; it exits when the run says 'finished'."""
    cmd = [
        *LOADCLIENT,
        "--broker",
        broker_url,
        "--clients",
        str(n),
        "--classes-each",
        str(classes_each),
        "--timings",
        str(out),
        "--log",
        str(log_file),
        *[arg for item in overrides for arg in ("--set", item)],
    ]
    # Its console goes to a file: a pipe nobody reads fills up and stalls its event loop.
    with open(log_file.with_suffix(".out"), "wb") as console:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=console, stderr=subprocess.STDOUT, start_new_session=True
        )


def _finish(process: subprocess.Popen[bytes], out: Path, timeout: float) -> dict[str, Any]:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise RuntimeError(f"load client hung; see {out.parent}") from None
    if process.returncode != 0 or not out.exists():
        raise RuntimeError(f"load client failed ({process.returncode}); see {out.parent}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _make_timed_coordinator(config: Any, broker: Any, out_dir: Path) -> Any:
    from mqttfl.nodes.coordinator import Coordinator
    from mqttfl.wire.downlinks import DownlinkPayloads

    class TimedCoordinator(Coordinator):
        def __init__(self) -> None:
            super().__init__(config, broker, out_dir)
            self.accepted_at: dict[int, list[float]] = defaultdict(list)
            self.marks: dict[int, dict[str, float]] = defaultdict(dict)
            aggregate = self.server.aggregate

            def timed_aggregate(t: int, uploads: list[Any]) -> Any:
                self.marks[t]["aggregate_begin"] = time.monotonic()
                result = aggregate(t, uploads)
                self.marks[t]["aggregate_end"] = time.monotonic()
                return result

            self.server.aggregate = timed_aggregate
            save = self.journal.save_checkpoint

            def timed_save(state: dict[str, Any], **kwargs: Any) -> None:
                began = time.monotonic()
                save(state, **kwargs)
                if "round" in state:
                    self.marks[int(state["round"])]["checkpoint_s"] = time.monotonic() - began

            self.journal.save_checkpoint = timed_save  # type: ignore[method-assign]
            publish = self.bus.publish

            async def timed_publish(topic: str, payload: bytes, **kwargs: Any) -> None:
                await publish(topic, payload, **kwargs)
                if topic.endswith("/start"):
                    self.marks[int(topic.split("/")[3])]["start_published"] = time.monotonic()

            self.bus.publish = timed_publish  # type: ignore[method-assign]

        def process(self, message: Any) -> None:
            before = len(self.gate.accepted)
            super().process(message)
            if "/up/" in message.topic and len(self.gate.accepted) > before:
                self.accepted_at[int(message.topic.split("/")[3])].append(time.monotonic())

        async def publish_downlinks(self, t: int, payloads: DownlinkPayloads) -> None:
            self.marks[t]["downlinks_begin"] = time.monotonic()
            await super().publish_downlinks(t, payloads)
            self.marks[t]["downlinks_published"] = time.monotonic()

    return TimedCoordinator()


@cache
def coordinator_under_load(
    n: int, rounds: int, method: str = "fedapa", extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run ``rounds`` rounds of the real coordinator against ``n`` load clients."""
    from mqttfl.bus.address import BrokerAddress
    from mqttfl.config import load_config
    from mqttfl.logs import configure_logging
    from mqttfl.provisioning.local_broker import LocalBroker

    work = WORK / f"load-{method}-{n}"
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    run_id = f"bench-load-{n}"
    overrides = [
        f"run_id={run_id}",
        f"method={method}",
        f"rounds={rounds}",
        f"federation.num_clients={n}",
        "federation.min_clients=1",
        "federation.round_timeout_s=300",
        "federation.join_timeout_s=300",
        "federation.final_metrics_timeout_s=0.2",
        f"model.num_classes={CLASSES}",
        f"model.embed_dim={DIM}",
        *extra,
    ]
    config = load_config(None, overrides)
    # As `mqttfl coordinator` does: everything to the JSON file, warnings to the console.
    configure_logging(work / "logs" / "coordinator.jsonl", level="debug", console_level="warning")
    with LocalBroker(work / "broker") as broker:
        load_out = work / "load.json"
        process = _start_load(
            broker.url, overrides, n, CLASSES, load_out, work / "logs" / "load.jsonl"
        )
        try:
            coordinator = _make_timed_coordinator(
                config, BrokerAddress.parse(broker.url), work / "run"
            )
            began = time.monotonic()
            summary = asyncio.run(coordinator.run())
            elapsed = time.monotonic() - began
            load = _finish(process, load_out, timeout=300)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
    rows = []
    for record in load["rounds"]:
        t = record["round"]
        accepted = sorted(coordinator.accepted_at.get(t, []))
        marks = coordinator.marks.get(t, {})
        following = coordinator.marks.get(t + 1, {})
        row: dict[str, Any] = {
            "round": t,
            "uploads_sent": record["uploads"],
            "uploads_accepted": len(accepted),
            "upload_bytes": record["bytes_each"],
            "complete_downlinks": record["complete_downlinks"],
            "down_bytes_per_client": record["down_bytes"] / n,
            "personal_bytes_max": record["personal_bytes_max"],
        }
        if accepted and record["t_publish"]:
            last = accepted[-1]
            # first upload handed to MQTT -> last one validated
            row["fanin_s"] = last - record["t_publish"]
            row["publish_acked_s"] = record["t_acked"] - record["t_publish"]
            row["receive_spread_s"] = last - accepted[0]
            if "downlinks_published" in marks:
                row["overhead_downlinks_s"] = marks["downlinks_published"] - last
                row["aggregate_s"] = marks["aggregate_end"] - marks["aggregate_begin"]
                row["publish_downlinks_s"] = marks["downlinks_published"] - marks["downlinks_begin"]
                if "checkpoint_s" in marks:
                    row["checkpoint_s"] = marks["checkpoint_s"]
            if "start_published" in following:
                row["overhead_next_start_s"] = following["start_published"] - last
            if record["t_last_complete"] is not None:
                row["last_upload_to_all_downlinks_held_s"] = record["t_last_complete"] - last
        rows.append(row)
    log(
        f"coordinator under load: {method} N={n}, {rounds} rounds in {elapsed:.1f} s, "
        f"rejections {(summary.rejections if summary else {}) or 'none'}"
    )
    return {
        "n": n,
        "method": method,
        "rounds": rows,
        "elapsed_s": elapsed,
        "rejections": summary.rejections if summary else {},
        "load_process_imported_torch": load["torch_imported"],
    }


def _raw_overrides(run_id: str, rounds: int) -> list[str]:
    """The load client's settings when a plain aiomqtt client, not a coordinator, drives it."""
    return [
        f"run_id={run_id}",
        f"rounds={rounds}",
        f"model.num_classes={CLASSES}",
        f"model.embed_dim={DIM}",
    ]


async def _all_online(client: Any, base: str, n: int) -> None:
    """Subscribe a plain aiomqtt ``client`` to the run's uploads and statuses; return once
    ``n`` load sessions have said they are online."""
    await client.subscribe(f"{base}/round/+/up/+", qos=1)
    await client.subscribe(f"{base}/status/+", qos=1)
    online: set[str] = set()
    async with asyncio.timeout(300):
        async for message in client.messages:
            if message.payload:
                online.add(message.topic.value.rsplit("/", 1)[1])
            if len(online) >= n:
                return


@cache
def raw_fanin(n: int, rounds: int) -> dict[str, Any]:
    """The same load client's uploads into one plain aiomqtt subscriber that only counts
    them (no decoding, no validation), which announces the rounds itself."""
    import aiomqtt

    from mqttfl.provisioning.local_broker import LocalBroker
    from mqttfl.wire.control import RoundStart, RunStatus

    work = WORK / f"raw-{n}"
    work.mkdir(parents=True, exist_ok=True)
    run_id = f"bench-raw-{n}"
    base = f"mqttfl/{run_id}"
    overrides = _raw_overrides(run_id, rounds)
    ids = [f"load{i:03d}" for i in range(n)]
    with LocalBroker(work / "broker") as broker:
        load_out = work / "load.json"
        process = _start_load(broker.url, overrides, n, CLASSES, load_out, work / "load.jsonl")
        try:
            last_seen: dict[int, float] = {}

            async def drive() -> None:
                async with aiomqtt.Client(
                    "127.0.0.1", broker.port, identifier=f"{run_id}-sink", max_inflight_messages=100
                ) as sink:
                    await _all_online(sink, base, n)
                    counts: dict[int, int] = defaultdict(int)
                    for t in range(1, rounds + 1):
                        start = RoundStart(t, tuple(ids), 60.0, {}, announcement=t)
                        await sink.publish(f"{base}/round/{t}/start", start.encode(run_id), qos=1)
                        async with asyncio.timeout(120):
                            async for message in sink.messages:
                                if "/up/" not in message.topic.value:
                                    continue
                                r = int(message.topic.value.split("/")[3])
                                counts[r] += 1
                                if counts[r] == n:
                                    last_seen[r] = time.monotonic()
                                    break
                        await asyncio.sleep(0.2)
                    finished = RunStatus("finished", rounds).encode(run_id)
                    await sink.publish(f"{base}/state", finished, qos=1, retain=True)

            asyncio.run(drive())
            load = _finish(process, load_out, timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
    rows = [
        {
            "round": r["round"],
            "fanin_s": last_seen[r["round"]] - r["t_publish"],
            "publish_acked_s": r["t_acked"] - r["t_publish"],
        }
        for r in load["rounds"]
        if r["round"] in last_seen and r["t_publish"]
    ]
    return {"n": n, "rounds": rows}


def _fedapa_downlinks(n: int, rounds: int, run_id: str, ids: list[str]) -> dict[int, Any]:
    """Each round's encoded downlinks as the coordinator would send them to ``ids``: the real
    FedAPA server aggregating random prototypes of the load client's shapes (the same
    sizes, the same broadcast and personal bodies, computed before any timing starts)."""
    import numpy as np

    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.algorithms.base import Upload
    from mqttfl.config import load_config
    from mqttfl.wire.downlinks import encode_downlinks
    from mqttfl.wire.schemas import ClientInfo

    config = load_config(
        None,
        [
            f"run_id={run_id}",
            f"rounds={rounds}",
            f"federation.num_clients={n}",
            f"model.num_classes={CLASSES}",
            f"model.embed_dim={DIM}",
        ],
    )
    server = get_algorithm("fedapa").server(make_context(config))
    rng = np.random.default_rng(0)
    classes = tuple(range(CLASSES))
    payloads = {}
    for t in range(1, rounds + 1):
        uploads = [
            Upload(
                cid,
                ClientInfo(cid, "tiny", classes, 50, (8,)),
                {
                    "classes": np.arange(CLASSES),
                    "prototypes": rng.standard_normal((CLASSES, DIM)).astype(np.float32),
                },
            )
            for cid in ids
        ]
        downlinks = server.aggregate(t, uploads)
        payloads[t] = encode_downlinks(run_id, t, downlinks.broadcast, downlinks.personal)
    return payloads


@cache
def raw_fanout(n: int, rounds: int) -> dict[str, Any]:
    """The wire's floor under the coordinator's turnaround: one plain aiomqtt client (the
    Bus's inflight window) publishes each round's FedAPA downlinks, precomputed, exactly
    as :meth:`~mqttfl.nodes.coordinator.Coordinator.publish_downlinks` does (all at once;
    the broadcast retained, the previous one cleared) to the same N load sessions, the
    moment the round's last upload has arrived. No decoding, aggregation, encoding or
    checkpoint: what is left is the broker's work and the reading clients'."""
    import aiomqtt

    from mqttfl.provisioning.local_broker import LocalBroker
    from mqttfl.wire import Topics
    from mqttfl.wire.control import RoundStart, RunStatus

    run_id = f"bench-rawout-{n}"
    topics = Topics(run_id)
    base = topics.base
    work = WORK / f"rawout-{n}"
    work.mkdir(parents=True, exist_ok=True)
    overrides = _raw_overrides(run_id, rounds)
    ids = [f"load{i:03d}" for i in range(n)]
    payloads = _fedapa_downlinks(n, rounds, run_id, ids)
    rows: list[dict[str, Any]] = []
    with LocalBroker(work / "broker") as broker:
        load_out = work / "load.json"
        process = _start_load(broker.url, overrides, n, CLASSES, load_out, work / "load.jsonl")
        try:

            async def drive() -> None:
                async with aiomqtt.Client(
                    "127.0.0.1", broker.port, identifier=f"{run_id}-hub", max_inflight_messages=100
                ) as hub:
                    hub.pending_calls_threshold = 2 * n + 10  # a round's downlinks at once
                    await _all_online(hub, base, n)
                    for t in range(1, rounds + 1):
                        start = RoundStart(t, tuple(ids), 60.0, {}, announcement=t)
                        await hub.publish(topics.start(t), start.encode(run_id), qos=1)
                        arrived = 0
                        async with asyncio.timeout(120):
                            async for message in hub.messages:
                                if message.topic.value.startswith(f"{base}/round/{t}/up/"):
                                    arrived += 1
                                    if arrived == n:
                                        break
                        last = time.monotonic()
                        out = payloads[t]
                        await asyncio.gather(
                            *(
                                hub.publish(topics.down(t, c), p, qos=1)
                                for c, p in out.personal.items()
                            ),
                            hub.publish(topics.down_all(t), out.broadcast, qos=1, retain=True),
                            *(
                                [hub.publish(topics.down_all(t - 1), b"", qos=1, retain=True)]
                                if t > 1
                                else []
                            ),
                        )
                        rows.append({"round": t, "publish_acked_s": time.monotonic() - last})
                        await asyncio.sleep(0.5)  # the load clients' metrics, as between rounds
                    finished = RunStatus("finished", rounds).encode(run_id)
                    await hub.publish(topics.state, finished, qos=1, retain=True)

            asyncio.run(drive())
            load = _finish(process, load_out, timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
    held = {r["round"]: r for r in load["rounds"]}
    for row in rows:
        record = held.get(row["round"], {})
        row["complete_downlinks"] = record.get("complete_downlinks")
    return {"n": n, "rounds": rows}
