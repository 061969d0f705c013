"""A reconnecting MQTT connection around aiomqtt 2.x (which does not reconnect itself).

The round logic sees three things: :meth:`Bus.publish`, the :attr:`Bus.incoming` queue
and the :attr:`Bus.connected` event. On every (re)connect the bus re-subscribes and
republishes its birth messages (a client's retained ``online`` status).
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiomqtt

from mqttfl.errors import BrokerError, WireError
from mqttfl.logs import get_logger
from mqttfl.wire.chunks import Reassembler, is_chunk, payload_budget, split

Birth = Callable[[], list[tuple[str, bytes, bool]]]
ConnectionListener = Callable[[bool], None]


def _no_delay(client: aiomqtt.Client) -> None:
    """Turn Nagle's algorithm off (paho leaves it on): otherwise the tail of a message
    written right after another waits for the broker's delayed ACK, 40 ms on Linux."""
    sock = client._client.socket()  # aiomqtt has no public handle on its socket
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://host:1883`` or ``mqtts://host:8883`` (the scheme defaults to mqtt);
        BrokerError says what is wrong with any other text."""
        try:
            parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        except ValueError as exc:  # an unclosed [IPv6 bracket
            raise BrokerError(f"malformed URL ({exc})") from None
        try:
            port = parts.port
        except ValueError:  # out of 0-65535, or not a number
            port_text = parts.netloc.rpartition(":")[2]
            raise BrokerError(f"port {port_text!r} is not a number in 1-65535") from None
        if parts.scheme not in ("mqtt", "mqtts"):
            raise BrokerError(f"the scheme must be mqtt or mqtts, not {parts.scheme!r}")
        if not parts.hostname:
            raise BrokerError("no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise BrokerError("a broker URL has no path, query or fragment")
        tls = parts.scheme == "mqtts"
        port = port if port is not None else (8883 if tls else 1883)
        if not 1 <= port <= 65535:
            raise BrokerError(f"port {port} is not in 1-65535")
        return cls(parts.hostname, port, tls)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


@dataclass
class Incoming:
    """A message as the bus received it (reassembled if it came in chunks). ``error``
    is set, and the payload empty, for chunks that could not be put together."""

    topic: str
    payload: bytes
    received: float = field(default_factory=time.monotonic)
    wire_bytes: int = -1  # what crossed the broker, chunk framing included
    error: WireError | None = None

    def __post_init__(self) -> None:
        if self.wire_bytes < 0:
            self.wire_bytes = len(self.payload)


MAX_BACKOFF_S = 5.0  # the longest wait between two reconnect attempts


class Bus:
    def __init__(
        self,
        address: BrokerAddress,
        *,
        identifier: str,
        subscriptions: list[str],
        will: tuple[str, bytes] | None = None,
        birth: Birth | None = None,
        credentials: Credentials | None = None,
        keepalive_s: int = 15,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = MAX_BACKOFF_S,
        persistent_session: bool = False,
        connect_timeout_s: float = 10.0,
        on_connection: ConnectionListener | None = None,
        max_message_bytes: int = 0,
        max_reassembled_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.address = address
        # A persistent session makes the broker keep our subscriptions and queue QoS 1
        # messages for us while we are disconnected (across broker restarts too, when
        # the broker persists its state).
        self.persistent_session = persistent_session
        self.identifier = identifier
        self.subscriptions = subscriptions
        self.will = will
        self.birth = birth
        self.credentials = credentials or Credentials()
        self.keepalive_s = keepalive_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.connect_timeout_s = connect_timeout_s
        self.on_connection = on_connection  # told True on every connect, False on every loss
        self.max_message_bytes = max_message_bytes  # the broker's packet limit; 0: none
        self.reassembler = Reassembler(max_reassembled_bytes)
        self.incoming: asyncio.Queue[Incoming] = asyncio.Queue()
        self.connected = asyncio.Event()
        self.connections = 0
        self._client: aiomqtt.Client | None = None
        self._lost = asyncio.Event()  # set when the current connection drops
        self._log = get_logger(component="bus", broker=str(address))

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.address.tls:
            return None
        context = ssl.create_default_context(cafile=self.credentials.tls_ca)
        if self.credentials.tls_cert:
            context.load_cert_chain(self.credentials.tls_cert, self.credentials.tls_key)
        return context

    def _make_client(self) -> aiomqtt.Client:
        will = None
        if self.will is not None:
            will = aiomqtt.Will(self.will[0], self.will[1], qos=1, retain=True)
        client = aiomqtt.Client(
            self.address.host,
            self.address.port,
            identifier=self.identifier,
            username=self.credentials.username,
            password=self.credentials.password,
            will=will,
            clean_session=not self.persistent_session,
            keepalive=self.keepalive_s,
            timeout=self.connect_timeout_s,
            tls_context=self._tls_context(),
            max_inflight_messages=100,
        )
        # The coordinator pipelines a round's downlinks (one publish per client at once);
        # aiomqtt would log a warning for every publish beyond its default of 10 pending.
        client.pending_calls_threshold = 100_000
        return client

    async def run(self) -> None:
        """Hold the connection open forever, reconnecting with jittered backoff."""
        delay = self.min_backoff_s
        while True:
            try:
                async with self._make_client() as client:
                    _no_delay(client)
                    for topic in self.subscriptions:
                        await client.subscribe(topic, qos=1)
                    for topic, payload, retain in self.birth() if self.birth else []:
                        await client.publish(topic, payload, qos=1, retain=retain)
                    self._client, self._lost = client, asyncio.Event()
                    self.connections += 1
                    self.connected.set()
                    self._log.info("broker.connected", connections=self.connections)
                    if self.on_connection is not None:
                        self.on_connection(True)
                    delay = self.min_backoff_s
                    async for message in client.messages:
                        payload = message.payload
                        if not isinstance(payload, bytes | bytearray):
                            payload = b"" if payload is None else str(payload).encode()
                        await self._receive(message.topic.value, bytes(payload))
            except aiomqtt.MqttError as exc:
                was_connected = self.connected.is_set()
                self.connected.clear()
                self._client = None
                self._lost.set()  # publishes awaiting a PUBACK on it go again on the next one
                event = "broker.disconnected" if was_connected else "broker.unreachable"
                if was_connected and self.on_connection is not None:
                    self.on_connection(False)
                self._log.warning(event, error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.max_backoff_s)

    async def _receive(self, topic: str, payload: bytes) -> None:
        """Queue a message; chunks are put back together first (any sender may chunk)."""
        if not is_chunk(payload):
            await self.incoming.put(Incoming(topic, payload))
            return
        whole: tuple[bytes, int] | None = None
        error: WireError | None = None
        try:
            whole = self.reassembler.feed(topic, payload)
        except WireError as exc:
            error = exc
        for lost in self.reassembler.evicted:
            evicted = WireError("chunk_incomplete", "evicted to keep partial messages bounded")
            await self.incoming.put(Incoming(lost, b"", error=evicted))
        self.reassembler.evicted.clear()
        if error is not None:
            await self.incoming.put(Incoming(topic, b"", wire_bytes=len(payload), error=error))
        elif whole is not None:
            await self.incoming.put(Incoming(topic, whole[0], wire_bytes=whole[1]))

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        timeout: float = 60.0,
    ) -> None:
        """Publish, waiting through reconnects; raise BrokerError after ``timeout``. Above
        the broker's packet limit the payload goes in chunks, in order, each acknowledged
        (a broker keeps one retained message per topic, so chunks are never retained)."""
        parts = [payload]
        if self.max_message_bytes:
            parts = split(payload, payload_budget(self.max_message_bytes, topic))
        for part in parts:
            await self._publish_one(
                topic, part, qos=qos, retain=retain and len(parts) == 1, timeout=timeout
            )

    async def _publish_one(
        self, topic: str, payload: bytes, *, qos: int, retain: bool, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise BrokerError(f"could not publish to {topic} within {timeout:.0f}s")
            try:
                await asyncio.wait_for(self.connected.wait(), timeout=remaining)
            except TimeoutError:
                continue
            client, lost = self._client, self._lost
            if client is None:
                await asyncio.sleep(0.05)
                continue
            try:
                if await self._send(
                    client,
                    lost,
                    topic,
                    payload,
                    qos=qos,
                    retain=retain,
                    timeout=max(remaining, 1.0),
                ):
                    return
                self._log.warning(
                    "publish.retrying", topic=topic, error="connection lost before the PUBACK"
                )
            except aiomqtt.MqttError as exc:
                self._log.warning("publish.retrying", topic=topic, error=str(exc))
                await asyncio.sleep(0.2)

    @staticmethod
    async def _send(
        client: aiomqtt.Client,
        lost: asyncio.Event,
        topic: str,
        payload: bytes,
        *,
        qos: int,
        retain: bool,
        timeout: float,
    ) -> bool:
        """One publish; False if the connection drops first (aiomqtt would wait out the
        timeout for a PUBACK that can no longer come)."""
        sending = asyncio.ensure_future(
            client.publish(topic, payload, qos=qos, retain=retain, timeout=timeout)
        )
        dropped = asyncio.ensure_future(lost.wait())
        try:
            done, _ = await asyncio.wait({sending, dropped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
            if not sending.done():
                sending.cancel()
        if sending not in done:
            return False
        sending.result()
        return True

    async def wait_connected(self, *, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), timeout=timeout)
        except TimeoutError:
            raise BrokerError(
                f"could not connect to {self.address} within {timeout:.0f}s"
            ) from None
