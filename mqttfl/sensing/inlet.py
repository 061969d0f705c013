"""A gateway's frames off the broker: paho's network thread into a bounded buffer.

The frames of ``--input mqtt:TOPIC`` come over a connection of their own, not the
:class:`~mqttfl.bus.transport.Bus` that publishes the readings. The bus hands each
message over through aiomqtt's queue (unbounded) and takes two or more turns of the
event loop per message: about 2,000 messages a second on a loaded core, so a flood of
10,000 a second grew that queue by 8,000 messages a second (500 MB in a minute) and
left the rest in the broker, minutes behind. Here paho's own thread reads (over 10,000
a second) into a :class:`FrameBuffer` that keeps at most ``max_frames`` frames and
``max_bytes`` of payload and makes room by dropping its oldest frames, counted in
``dropped``; the event loop takes everything buffered at once.

The connection subscribes at QoS 0 (a frame is worth nothing late, and acknowledging
each would double the traffic of a flood), speaks the MQTT version the bus found the
broker speaks, and under MQTT 5 tells the broker the largest packet it takes (a frame's
limit), so a larger message never reaches this process. Its client id is the bus's with
``.frames`` appended (a sensor's node id never holds a ``.``, so no other sensor's id can
be it). paho reconnects by itself; a refused login or subscription ends the sensor with
one line.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections import deque
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.refusal import Refused, login_refused, user_text
from mqttfl.bus.transport import Incoming
from mqttfl.errors import BrokerError, MqttflError
from mqttfl.sensing.frames import MAX_FRAME_BYTES

MAX_QUEUED_FRAMES = 1024  # 10 s at 100 packets/s; ~15 ms of work to read them all
MAX_QUEUED_BYTES = 64 * MAX_FRAME_BYTES  # 4 MB: ~20,000 ESP frames, 64 of the largest
KEEPALIVE_S = 15


class FrameBuffer:
    """Messages put by one thread and taken by another; past ``max_frames`` messages or
    ``max_bytes`` of payload the oldest are dropped (``dropped`` counts them)."""

    def __init__(self, *, max_frames: int = MAX_QUEUED_FRAMES, max_bytes: int = MAX_QUEUED_BYTES):
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.dropped = 0
        self._items: deque[Incoming] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, item: Incoming) -> bool:
        """Keep ``item``, dropping the oldest to make room; True if the buffer was empty."""
        size = len(item.payload)
        with self._lock:
            was_empty = not self._items
            while self._items and (
                len(self._items) >= self.max_frames or self._bytes + size > self.max_bytes
            ):
                self._bytes -= len(self._items.popleft().payload)
                self.dropped += 1
            self._items.append(item)
            self._bytes += size
        return was_empty

    def drain(self) -> list[Incoming]:
        """Everything buffered, oldest first."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._bytes = 0
        return items


class FrameInlet:
    """The messages of one topic, read in paho's thread; :meth:`take` them in the loop."""

    def __init__(
        self,
        address: BrokerAddress,
        credentials: Credentials,
        *,
        topic: str,
        client_id: str,
        mqtt5: bool = True,
        buffer: FrameBuffer | None = None,
    ) -> None:
        self.address, self.credentials, self.topic = address, credentials, topic
        self.buffer = buffer or FrameBuffer()
        self.error: MqttflError | None = None
        self.connections = 0
        self._ready = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mqtt5 = mqtt5
        protocol = paho.MQTTv5 if mqtt5 else paho.MQTTv311
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol
        )
        if credentials.username is not None:
            self._client.username_pw_set(credentials.username, credentials.password)
        if address.tls:
            context = ssl.create_default_context(cafile=credentials.tls_ca)
            if credentials.tls_cert:
                context.load_cert_chain(credentials.tls_cert, credentials.tls_key)
            self._client.tls_set_context(context)
        self._client.reconnect_delay_set(min_delay=1, max_delay=5)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message

    @property
    def dropped(self) -> int:
        return self.buffer.dropped

    @property
    def max_frames(self) -> int:
        return self.buffer.max_frames

    def start(self) -> None:
        """Connect (and reconnect) in paho's thread; call from the event loop."""
        self._loop = asyncio.get_running_loop()
        properties = None
        if self._mqtt5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.MaximumPacketSize = MAX_FRAME_BYTES + 1024  # topic and header
        self._client.connect_async(
            self.address.host, self.address.port, keepalive=KEEPALIVE_S, properties=properties
        )
        self._client.loop_start()

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    async def wait_subscribed(self, *, timeout: float) -> None:
        """Until the broker granted the subscription; BrokerError after ``timeout``, the
        refusal if it refused."""
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout=timeout)
        except TimeoutError:
            raise BrokerError(
                f"could not subscribe to {self.topic} on {self.address} within {timeout:.0f}s"
            ) from None
        if self.error is not None:
            raise self.error

    async def take(self) -> list[Incoming]:
        """Every buffered message, oldest first, waiting for one if there are none;
        the refusal that stopped the connection, if one did."""
        while True:
            if self.error is not None:
                raise self.error
            batch = self.buffer.drain()
            if batch:
                return batch
            self._ready.clear()
            batch = self.buffer.drain()  # what came between the drain and the clear
            if batch:
                return batch
            await self._ready.wait()

    # --- paho's thread --------------------------------------------------------------------
    def _wake(self, event: asyncio.Event | None = None) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe((event or self._ready).set)

    def _fail(self, error: MqttflError) -> None:
        self.error = error
        self._client.disconnect()
        self._wake()
        self._wake(self._subscribed)

    def _on_connect(self, client: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if getattr(reason, "is_failure", False):
            origin = self.credentials.origin
            self._fail(login_refused(str(self.address), self.credentials.username, reason, origin))
            return
        self.connections += 1
        client.subscribe(self.topic, qos=0)

    def _on_subscribe(self, _c: paho.Client, _u: Any, _m: int, reasons: Any, _p: Any) -> None:
        for reason in reasons:
            if getattr(reason, "is_failure", False):
                user = user_text(self.credentials.username)
                self._fail(
                    Refused(
                        f"the broker refused {user} a subscription to {self.topic}: "
                        f"{str(reason).lower()}"
                    )
                )
                return
        self._wake(self._subscribed)

    def _on_message(self, _c: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        item = Incoming(message.topic, bytes(message.payload), received=time.monotonic())
        if self.buffer.put(item):
            self._wake()
