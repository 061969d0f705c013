"""A reconnecting MQTT connection around aiomqtt 2.x (which does not reconnect itself).

The round logic sees three things: :meth:`Bus.publish`, the :attr:`Bus.incoming` queue
and the :attr:`Bus.connected` event. On every (re)connect the bus re-subscribes and
republishes its birth messages (a client's retained ``online`` status).

It speaks MQTT 5, so the broker can say what it refuses (:mod:`mqttfl.bus.refusal`): a
refused login, publish or subscription ends :meth:`Bus.run` with one
:class:`~mqttfl.bus.refusal.Refused` line instead of a retry loop. A broker that does
not speak MQTT 5 (RabbitMQ before 3.13 closes the connection) gets MQTT 3.1.1, where
refused publishes go unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.connection import ConnectionLost, no_delay
from mqttfl.bus.library_log import LIBRARY_LOG
from mqttfl.bus.refusal import (
    CLIENT_HINT,
    KEEPALIVE_TIMEOUT,
    LOGIN_REFUSALS,
    SESSION_TAKEN_OVER,
    UNSUPPORTED_PROTOCOL,
    Refused,
    login_refused,
    publish_refused,
    reason_value,
    taken_over,
    user_text,
)
from mqttfl.bus.shared import PROCESS_PAYLOADS
from mqttfl.errors import BrokerError, WireError
from mqttfl.logs import get_logger
from mqttfl.wire.chunks import Reassembler, is_chunk, message_id_of, payload_budget, split

Birth = Callable[[], list[tuple[str, bytes, bool]]]
ConnectionListener = Callable[[bool], None]


@dataclass
class Incoming:
    """A message as the bus received it (reassembled if it came in chunks). ``error``
    is set, and the payload empty, for chunks that could not be put together."""

    topic: str
    payload: bytes
    received: float = field(default_factory=time.monotonic)
    wire_bytes: int = -1  # what crossed the broker, chunk framing included
    error: WireError | None = None
    message_id: int | None = None  # of a chunked message (the one ``error`` is about)
    retained: bool = False  # the broker's stored copy, sent on subscribing

    def __post_init__(self) -> None:
        if self.wire_bytes < 0:
            self.wire_bytes = len(self.payload)


MAX_BACKOFF_S = 5.0  # the longest wait between two reconnect attempts
# A session taken over this soon after our first connect: we are the second process with
# this client id (the first one reconnects and takes it back), so we stop.
TAKEOVER_WINDOW_S = 10.0
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry: as MQTT 3.1.1's persistent session


class ClosedBeforeConnack(BrokerError, aiomqtt.MqttError):
    """The broker closed the connection without answering CONNECT (RabbitMQ < 3.13 does
    this to MQTT 5). An aiomqtt error, so the reconnect loop takes it as one."""


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
        sender_of: Callable[[str], str] | None = None,
        who: str | None = None,
        fresh_session: bool = False,
        events: str = "broker",
        refusal_hint: str = CLIENT_HINT,
    ) -> None:
        """``who`` names this process in the line a refusal prints (``client '3'``), and
        ``refusal_hint`` what a refused publish likely means for it;
        ``fresh_session`` drops a persistent session the broker still holds for this
        client id (queued messages of an earlier run) on the first connect; ``events``
        prefixes the connection's log events (a short look is not the node's connection)."""
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
        # ``sender_of`` names the sender of a topic, so that each sender's partial
        # messages are bounded apart from everyone else's (default: one per topic).
        self.reassembler = Reassembler(max_reassembled_bytes)
        if sender_of is not None:
            self.reassembler.sender_of = sender_of
        self.incoming: asyncio.Queue[Incoming] = asyncio.Queue()
        self.connected = asyncio.Event()
        self.connections = 0
        self._client: aiomqtt.Client | None = None
        self._lost = ConnectionLost()  # set when the current connection drops
        self._log = get_logger(component="bus", broker=str(address))
        self.who = who or identifier
        self.refusal_hint = refusal_hint
        self.events = events
        self.fresh_session = fresh_session
        self.protocol = aiomqtt.ProtocolVersion.V5
        self._closed_early = 0  # connects the broker closed before its CONNACK, in a row
        self._acks: dict[int, asyncio.Future[Any]] = {}  # PUBACK reason codes by packet id
        self._fatal: asyncio.Future[None] | None = None
        self._connected_at = 0.0
        self.stopped = False  # run() has ended: publishing fails at once

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
        clean = not self.persistent_session or (self.fresh_session and self.connections == 0)
        session: dict[str, Any] = {"clean_session": clean}
        if self.protocol is aiomqtt.ProtocolVersion.V5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0 if clean else NEVER_EXPIRES
            session = {"clean_start": clean, "properties": properties}
        client = aiomqtt.Client(
            self.address.host,
            self.address.port,
            identifier=self.identifier,
            username=self.credentials.username,
            password=self.credentials.password,
            protocol=self.protocol,
            will=will,
            keepalive=self.keepalive_s,
            timeout=self.connect_timeout_s,
            tls_context=self._tls_context(),
            max_inflight_messages=100,
            logger=LIBRARY_LOG,
            **session,
        )
        self._watch_acks(client)
        return client

    def _watch_acks(self, client: aiomqtt.Client) -> None:
        """Keep each PUBACK's reason code (aiomqtt drops it), and fail a connect the broker
        closes without a CONNACK at once (aiomqtt would wait out its timeout)."""
        acks: dict[int, asyncio.Future[Any]] = {}
        self._acks = acks
        paho_client = client._client  # aiomqtt exposes neither callback

        def on_publish(_c: object, _u: object, mid: int, reason: Any, _p: object) -> None:
            acked = acks.get(mid)
            if acked is not None and not acked.done():
                acked.set_result(reason)

        def on_disconnect(c: paho.Client, u: Any, flags: Any, reason: Any, p: Any = None) -> None:
            if not client._connected.done():  # paho's own close of a slow connect is no refusal
                late = reason_value(reason) == KEEPALIVE_TIMEOUT
                client._connected.set_exception(
                    aiomqtt.MqttError(f"no CONNACK within the keepalive, {self.keepalive_s} s")
                    if late
                    else ClosedBeforeConnack(f"the broker closed the connection ({reason})")
                )
            client._on_disconnect(c, u, flags, reason, p)

        paho_client.on_publish = on_publish
        paho_client.on_disconnect = on_disconnect

    async def run(self) -> None:
        """Hold the connection open forever, reconnecting with jittered backoff; raise
        :class:`Refused` when the broker refuses something that retrying cannot fix."""
        self.stopped = False
        self._fatal = asyncio.get_running_loop().create_future()
        session = asyncio.ensure_future(self._hold())
        try:
            await asyncio.wait({session, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._fatal.done():
                # Seen even when we are cancelled: the publish it refused has raised it to
                # its caller, who stops us (asyncio would print it as never retrieved).
                self._fatal.exception()
            if not session.done():
                session.cancel()
                await asyncio.wait({session})
            self.connected.clear()
            self._client = None
            self._lost.set()
            self.stopped = True
        failure = None if session.cancelled() else session.exception()
        if self._fatal.done():
            self._fatal.result()
        if failure is not None:
            raise failure

    def _fail(self, error: Refused) -> Refused:
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(error)
        return error

    async def _hold(self) -> None:
        delay = self.min_backoff_s
        while True:
            try:
                async with self._make_client() as client:
                    no_delay(client)
                    for topic in list(self.subscriptions):
                        self._check_subscribed(topic, await client.subscribe(topic, qos=1))
                    lost = ConnectionLost()
                    for topic, payload, retain in self.birth() if self.birth else []:
                        await self._send(
                            client,
                            lost,
                            topic,
                            payload,
                            qos=1,
                            retain=retain,
                            timeout=self.connect_timeout_s,
                        )
                    self._client, self._lost = client, lost
                    self.connections += 1
                    self._connected_at = time.monotonic()
                    self.connected.set()
                    self._log.info(
                        f"{self.events}.connected",
                        connections=self.connections,
                        mqtt=self.protocol.name,
                    )
                    if self.on_connection is not None:
                        self.on_connection(True)
                    delay = self.min_backoff_s
                    async for message in client.messages:
                        await self._take(message)
                        # aiomqtt hands out one message per task (two loop iterations),
                        # while paho reads one or more an iteration: under a flood its
                        # queue would only grow. What is queued already is taken at once
                        # (aiomqtt 2.x keeps it in ``_queue``; pinned <3 in pyproject.toml).
                        while len(client.messages):
                            await self._take(client._queue.get_nowait())
            except aiomqtt.MqttError as exc:
                was_connected = self.connected.is_set()
                self.connected.clear()
                self._client = None
                self._lost.set()  # publishes awaiting a PUBACK on it go again on the next one
                if not was_connected and self._refused_login(exc):
                    continue  # MQTT 3.1.1 from now on: retry at once
                if was_connected and self._taken_over(exc):
                    raise self._fail(taken_over(self.who, self.identifier)) from None
                event = f"{self.events}.{'disconnected' if was_connected else 'unreachable'}"
                if was_connected and self.on_connection is not None:
                    self.on_connection(False)
                self._log.warning(event, error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.max_backoff_s)

    async def _take(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        if not isinstance(payload, bytes | bytearray):
            payload = b"" if payload is None else str(payload).encode()
        topic = message.topic.value
        shared = PROCESS_PAYLOADS.share(topic, bytes(payload))
        await self._receive(topic, shared, retained=message.retain)

    def _refused_login(self, exc: aiomqtt.MqttError) -> bool:
        """Raise :class:`Refused` for a refused login; True to connect again at once: MQTT
        5 was not understood (the bus falls back to MQTT 3.1.1), or the broker closed a
        first MQTT 5 connect (a broker without it closes every one); False for anything
        worth retrying after a pause."""
        code = reason_value(getattr(exc, "rc", None))
        if isinstance(exc, MqttConnectError) and code in LOGIN_REFUSALS:
            raise self._fail(
                login_refused(
                    str(self.address), self.credentials.username, exc.rc, self.credentials.origin
                )
            ) from None
        v5 = self.protocol is aiomqtt.ProtocolVersion.V5
        closed = isinstance(exc, ClosedBeforeConnack)
        self._closed_early = self._closed_early + 1 if closed else 0
        unsupported = (closed and self._closed_early >= 2) or (
            isinstance(exc, MqttConnectError) and code in UNSUPPORTED_PROTOCOL
        )
        if v5 and unsupported and self.connections == 0:
            self.protocol = aiomqtt.ProtocolVersion.V311
            self._log.warning(
                "broker.mqtt311", reason=str(exc), note="refused publishes go unnoticed"
            )
        return v5 and (unsupported or closed) and self.connections == 0

    def _taken_over(self, exc: aiomqtt.MqttError) -> bool:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        code = reason_value(getattr(cause, "rc", None))
        young = time.monotonic() - self._connected_at < TAKEOVER_WINDOW_S
        return code == SESSION_TAKEN_OVER and self.connections == 1 and young

    async def subscribe(self, topic: str) -> None:
        """Subscribe to ``topic`` from now on (again on every reconnect); the broker sends
        its retained message at once. Raises :class:`Refused` as a refused subscription
        at connect does."""
        if topic in self.subscriptions:
            return
        self.subscriptions.append(topic)
        if (client := self._client) is not None:
            try:
                granted = await client.subscribe(topic, qos=1, timeout=self.connect_timeout_s)
            except aiomqtt.MqttError:
                return  # the connection went: the next one subscribes it
            self._check_subscribed(topic, granted)

    async def unsubscribe(self, topic: str) -> None:
        if topic not in self.subscriptions:
            return
        self.subscriptions.remove(topic)
        if (client := self._client) is not None:
            with contextlib.suppress(aiomqtt.MqttError):  # gone: the next one never subscribes it
                await client.unsubscribe(topic, timeout=self.connect_timeout_s)

    def _check_subscribed(self, topic: str, granted: Any) -> None:
        for reason in granted if isinstance(granted, list) else []:
            if getattr(reason, "is_failure", False):
                user = user_text(self.credentials.username)
                raise self._fail(
                    Refused(
                        f"{self.who} ({user}) may not subscribe to {topic}: the broker "
                        f"refused it, {str(reason).lower()} (MQTT reason code "
                        f"{reason_value(reason)}); the ACL's run id (broker init --run-id) "
                        "and the device's credentials must fit this run"
                    )
                )

    async def _receive(self, topic: str, payload: bytes, *, retained: bool = False) -> None:
        """Queue a message; chunks are put back together first (any sender may chunk)."""
        if not is_chunk(payload):
            await self.incoming.put(Incoming(topic, payload, retained=retained))
            return
        whole: tuple[bytes, int] | None = None
        error: WireError | None = None
        try:
            whole = self.reassembler.feed(topic, payload)
        except WireError as exc:
            error = exc
        for lost, lost_id in self.reassembler.evicted:
            evicted = WireError(
                "chunk_incomplete", "a partial message given up on (replaced, bounded or idle)"
            )
            await self.incoming.put(Incoming(lost, b"", error=evicted, message_id=lost_id))
        self.reassembler.evicted.clear()
        if error is not None:
            await self.incoming.put(
                Incoming(
                    topic,
                    b"",
                    wire_bytes=len(payload),
                    error=error,
                    message_id=message_id_of(payload),
                )
            )
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
    ) -> int | None:
        """Publish, waiting through reconnects; raise BrokerError after ``timeout``. Above
        the broker's packet limit the payload goes in chunks, in order, each acknowledged
        (a broker keeps one retained message per topic, so chunks are never retained).
        Returns the chunked message's id (None when it went whole)."""
        parts = [payload]
        if self.max_message_bytes:
            parts = split(payload, payload_budget(self.max_message_bytes, topic))
        for part in parts:
            await self._publish_one(
                topic, part, qos=qos, retain=retain and len(parts) == 1, timeout=timeout
            )
        return message_id_of(parts[0]) if len(parts) > 1 else None

    async def _publish_one(
        self, topic: str, payload: bytes, *, qos: int, retain: bool, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if self.stopped:
                raise BrokerError(f"could not publish to {topic}: the bus has stopped")
            if remaining <= 0:
                raise BrokerError(f"could not publish to {topic} within {timeout:.0f}s")
            if not self.connected.is_set():
                try:  # a short wait at a time: the bus may stop meanwhile
                    await asyncio.wait_for(self.connected.wait(), timeout=min(remaining, 0.5))
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

    async def _send(
        self,
        client: aiomqtt.Client,
        lost: ConnectionLost,
        topic: str,
        payload: bytes,
        *,
        qos: int,
        retain: bool,
        timeout: float,
    ) -> bool:
        """One publish; False if the connection drops first (the PUBACK can no longer
        come). A PUBACK with a failure reason code raises :class:`Refused`."""
        info = client._client.publish(topic, payload, qos=qos, retain=retain)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
        if qos == 0:
            return True
        acks = self._acks
        acked = acks.setdefault(info.mid, asyncio.get_running_loop().create_future())
        dropped = lost.future()
        try:
            done, _ = await asyncio.wait(
                {acked, dropped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            acks.pop(info.mid, None)
        if acked in done:
            reason = acked.result()
            if getattr(reason, "is_failure", False):
                raise self._fail(
                    publish_refused(
                        self.who, self.credentials.username, topic, reason, self.refusal_hint
                    )
                )
            return True
        if dropped in done:
            return False
        raise aiomqtt.MqttError(f"no PUBACK for {topic} within {timeout:.0f}s")

    async def wait_connected(self, *, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.connected.wait(), timeout=timeout)
        except TimeoutError:
            raise BrokerError(
                f"could not connect to {self.address} within {timeout:.0f}s"
            ) from None
