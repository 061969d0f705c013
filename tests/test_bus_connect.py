"""How the bus reads a connect that gets no CONNACK, against a real Mosquitto behind a
loopback relay that shapes the first packets.

A broker without MQTT 5 (RabbitMQ before 3.13) closes every MQTT 5 connect unanswered,
and the bus falls back to MQTT 3.1.1, where a publish the broker refuses goes unnoticed.
A CONNACK that comes late (two loaded cores: a device took over ten seconds to connect)
is no such broker: paho gives the connect up after one keepalive, and the bus must try
again in MQTT 5, or an ACL's refusal would never reach the device, which would wait for
a run it cannot join.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiomqtt

from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus
from mqttfl.provisioning.local_broker import LocalBroker

#: what the relay does with a connection, given its number and the client's first bytes
Shape = Callable[[int, bytes], Awaitable[bool]]  # False: close it unanswered


@contextlib.asynccontextmanager
async def relay(target: int, shape: Shape) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP relay on a free loopback port to the broker on ``target``; yields its port
    and the protocol level of each connection's CONNECT, in order."""
    levels: list[int] = []
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        first = await reader.read(65536)
        # CONNECT: fixed header (1 byte, then a 1-byte length below 128), then the
        # protocol name "MQTT" (2 + 4 bytes), then the protocol level
        level = first[8] if len(first) > 8 else 0
        levels.append(level)
        if not await shape(len(levels), first):
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        writers.append(up_writer)
        up_writer.write(first)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], levels
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await asyncio.sleep(0.1)  # the handlers see their connections end


async def _connect(port: int) -> Bus:
    bus = Bus(
        BrokerAddress.parse(f"mqtt://127.0.0.1:{port}"),
        identifier="slow-connack",
        subscriptions=[],
        keepalive_s=1,
        min_backoff_s=0.05,
        connect_timeout_s=10,
    )
    task = asyncio.create_task(bus.run())
    try:
        await bus.wait_connected(timeout=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return bus


async def test_a_connack_later_than_the_keepalive_keeps_mqtt_5(broker: LocalBroker) -> None:
    async def hold_the_first(number: int, first: bytes) -> bool:
        if number == 1:
            await asyncio.sleep(3.0)  # three keepalives: paho gives this connect up
        return True

    async with relay(broker.port, hold_the_first) as (port, levels):
        bus = await _connect(port)
    assert len(levels) >= 2, levels
    assert set(levels) == {5}, levels  # every connect in MQTT 5
    assert bus.protocol is aiomqtt.ProtocolVersion.V5


async def test_a_broker_that_closes_every_mqtt_5_connect_gets_mqtt_3_1_1(
    broker: LocalBroker,
) -> None:
    async def no_mqtt_5(number: int, first: bytes) -> bool:
        return first[8] != 5  # as RabbitMQ 3.10's MQTT plugin does

    async with relay(broker.port, no_mqtt_5) as (port, levels):
        bus = await _connect(port)
    assert levels == [5, 5, 4]  # one close proves nothing; the second does
    assert bus.protocol is aiomqtt.ProtocolVersion.V311


async def test_one_close_before_the_connack_is_tried_again_in_mqtt_5(
    broker: LocalBroker,
) -> None:
    async def close_the_first(number: int, first: bytes) -> bool:
        return number > 1

    async with relay(broker.port, close_the_first) as (port, levels):
        bus = await _connect(port)
    assert levels == [5, 5]
    assert bus.protocol is aiomqtt.ProtocolVersion.V5
