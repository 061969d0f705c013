"""A torch-free load generator: N lightweight MQTT clients in one process.

Each client announces itself on its retained status topic like a real mqttfl client,
subscribes to its personal downlink, and, whenever the coordinator starts a round that
selects it, publishes one FedAPA upload: ``classes`` (k int64), ``prototypes`` (k×d
float32), with k = C, i.e. 21×256 float32 = 21 KB of prototypes.

The messages are built here with the wire format of ``mqttfl.wire.codec`` (msgpack
envelope, arrays as extension 1 holding ``[dtype, shape, bytes]``) rather than imported,
because importing anything under ``mqttfl`` imports torch. The coordinator validates
every upload, so a drift from the real codec shows up as rejected uploads.

Per round it records, on the system-wide monotonic clock (comparable across processes):
``t_publish`` just before the first upload is handed to MQTT, ``t_acked`` when the last
PUBACK came back, and ``t_last_personal`` when the last personal downlink arrived.

    python -m benchmarks.loadpub --broker mqtt://127.0.0.1:1883 --run bench --clients 100 \
        --out timings.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiomqtt
import msgpack
import numpy as np

SCHEMA_VERSION = 1
ARRAY_EXT = 1


def _array(value: np.ndarray) -> msgpack.ExtType:
    wire = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    return msgpack.ExtType(
        ARRAY_EXT, msgpack.packb([wire.dtype.str, list(wire.shape), wire.tobytes()])
    )


def encode(kind: str, run: str, t: int, sender: str, body: dict[str, Any]) -> bytes:
    """One message in mqttfl's wire format (see mqttfl/wire/codec.py)."""
    envelope = {
        "v": SCHEMA_VERSION,
        "type": kind,
        "run": run,
        "round": t,
        "sender": sender,
        "body": body,
    }
    return msgpack.packb(envelope, default=_array, use_bin_type=True)


def status_online(run: str, client: str, classes: int, samples: int) -> bytes:
    body = {
        "state": "online",
        "arch": "large",
        "classes": list(range(classes)),
        "num_samples": samples,
        "sample_shape": [1, 24, 242],
    }
    return encode("status", run, 0, client, body)


def upload_body(rng: np.random.Generator, classes: int, dim: int) -> dict[str, Any]:
    return {
        "classes": np.arange(classes, dtype=np.int64),
        "prototypes": rng.standard_normal((classes, dim)).astype(np.float32),
    }


class LoadClients:
    def __init__(self, args: argparse.Namespace) -> None:
        url = urlparse(args.broker)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 1883
        self.args = args
        self.base = f"mqttfl/{args.run}"
        self.ids = [str(i) for i in range(args.clients)]
        rng = np.random.default_rng(args.seed)
        self.bodies = {cid: upload_body(rng, args.classes, args.dim) for cid in self.ids}
        self.clients: dict[str, aiomqtt.Client] = {}
        self.rounds: list[dict[str, Any]] = []
        self.personal_seen: dict[int, int] = {}
        self.personal_last: dict[int, float] = {}
        self.done = asyncio.Event()
        self.listening = asyncio.Event()

    def _client(self, identifier: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            self.host,
            self.port,
            identifier=identifier,
            clean_session=True,
            keepalive=120,
            timeout=60,
            max_inflight_messages=100,
        )

    def _no_delay(self, client: aiomqtt.Client) -> None:
        """TCP_NODELAY, as mqttfl's transport sets it (paho leaves Nagle on)."""
        sock = client._client.socket()  # aiomqtt has no public handle on the socket
        if self.args.nodelay and sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def _connect(self, cid: str) -> None:
        client = self._client(f"load-{self.args.run}-{cid}")
        await client.__aenter__()
        self._no_delay(client)
        self.clients[cid] = client
        if self.args.personal:
            await client.subscribe(f"{self.base}/round/+/down/{cid}", qos=1)
        payload = status_online(self.args.run, cid, self.args.classes, self.args.samples)
        await client.publish(f"{self.base}/status/{cid}", payload, qos=1, retain=True)

    async def _read_personal(self, cid: str) -> None:
        async for message in self.clients[cid].messages:
            t = int(message.topic.value.split("/")[3])
            self.personal_seen[t] = self.personal_seen.get(t, 0) + 1
            self.personal_last[t] = time.monotonic()

    async def _on_start(self, t: int, selected: list[str]) -> None:
        mine = [cid for cid in selected if cid in self.clients]
        payloads = {cid: encode("upload", self.args.run, t, cid, self.bodies[cid]) for cid in mine}
        t_publish = time.monotonic()
        await asyncio.gather(
            *(
                self.clients[cid].publish(f"{self.base}/round/{t}/up/{cid}", payloads[cid], qos=1)
                for cid in mine
            )
        )
        t_acked = time.monotonic()
        self.rounds.append(
            {
                "round": t,
                "uploads": len(mine),
                "t_publish": t_publish,
                "t_acked": t_acked,
                "bytes_each": len(next(iter(payloads.values()))) if payloads else 0,
            }
        )

    async def _control(self) -> None:
        async with self._client(f"load-{self.args.run}-control") as control:
            await control.subscribe(f"{self.base}/round/+/start", qos=1)
            await control.subscribe(f"{self.base}/state", qos=1)
            self.listening.set()
            async for message in control.messages:
                topic = message.topic.value
                raw = message.payload if isinstance(message.payload, bytes | bytearray) else b""
                if not raw:
                    continue
                envelope = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                body = envelope.get("body", {})
                if topic.endswith("/state"):
                    if body.get("status") == "finished":
                        self.done.set()
                        return
                    continue
                t = int(topic.split("/")[3])
                if any(r["round"] == t for r in self.rounds):
                    continue  # a re-announced round: already uploaded
                await self._on_start(t, [str(c) for c in body.get("selected", self.ids)])
                if (
                    self.args.rounds
                    and len(self.rounds) >= self.args.rounds
                    and not self.args.wait_finished
                ):
                    self.done.set()
                    return

    async def run(self) -> dict[str, Any]:
        began = time.monotonic()
        gate = asyncio.Semaphore(50)

        async def connect(cid: str) -> None:
            async with gate:
                await self._connect(cid)

        await asyncio.gather(*(connect(cid) for cid in self.ids))
        connected = time.monotonic() - began
        readers = (
            [asyncio.create_task(self._read_personal(cid)) for cid in self.ids]
            if self.args.personal
            else []
        )
        control = asyncio.create_task(self._control())
        await asyncio.wait_for(self.listening.wait(), timeout=60)
        sys.stdout.write(
            json.dumps(
                {
                    "ready": True,
                    "clients": len(self.clients),
                    "connect_seconds": round(connected, 3),
                }
            )
            + "\n"
        )
        sys.stdout.flush()
        try:
            await asyncio.wait_for(self.done.wait(), timeout=self.args.timeout)
        except TimeoutError:
            pass
        await asyncio.sleep(self.args.linger)
        control.cancel()
        for task in readers:
            task.cancel()
        for cid, client in self.clients.items():
            try:
                await client.publish(f"{self.base}/status/{cid}", b"", qos=1, retain=True)
                await client.__aexit__(None, None, None)
            except aiomqtt.MqttError:
                pass
        for record in self.rounds:
            record["personal_received"] = self.personal_seen.get(record["round"], 0)
            record["t_last_personal"] = self.personal_last.get(record["round"])
        return {
            "clients": len(self.clients),
            "connect_seconds": connected,
            "rounds": self.rounds,
            "torch_imported": "torch" in sys.modules,
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--run", required=True, help="run id (topic prefix mqttfl/<run>/)")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--samples", type=int, default=100, help="announced sample count")
    parser.add_argument(
        "--rounds", type=int, default=0, help="stop after this many rounds (0: until finished)"
    )
    parser.add_argument(
        "--wait-finished", action="store_true", help="after --rounds, still wait for 'finished'"
    )
    parser.add_argument(
        "--no-personal",
        dest="personal",
        action="store_false",
        help="do not subscribe to personal downlinks",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--nagle",
        dest="nodelay",
        action="store_false",
        help="leave Nagle's algorithm on (paho's default) instead of TCP_NODELAY",
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--linger", type=float, default=0.5, help="seconds to keep reading after the end"
    )
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(LoadClients(args).run())
    args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
