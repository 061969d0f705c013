"""A subscription taken while the bus runs (a client fetching one round's broadcast on
demand): the broker's retained copy arrives at once, the subscription is taken again on
every reconnect, and once dropped nothing more arrives on it. Against a real Mosquitto."""

from __future__ import annotations

import asyncio
import contextlib

from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus, Incoming
from mqttfl.provisioning.local_broker import LocalBroker


async def _next(bus: Bus, timeout: float = 10.0) -> Incoming:
    return await asyncio.wait_for(bus.incoming.get(), timeout)


async def _nothing(bus: Bus, wait: float = 0.5) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(bus.incoming.get(), wait)
        return False
    return True


async def test_a_subscription_taken_later_gets_the_retained_copy_survives_a_reconnect_and_ends(
    broker: LocalBroker,
) -> None:
    address = BrokerAddress.parse(broker.url)
    sender = Bus(address, identifier="sender", subscriptions=[])
    reader = Bus(address, identifier="reader", subscriptions=["other/#"], min_backoff_s=0.1)
    tasks = [asyncio.create_task(sender.run()), asyncio.create_task(reader.run())]
    try:
        await sender.wait_connected(timeout=10)
        await reader.wait_connected(timeout=10)
        await sender.publish("run/round/3/down/all", b"three", retain=True, timeout=10)
        assert await _nothing(reader)  # not subscribed to it yet
        await reader.subscribe("run/round/3/down/all")
        got = await _next(reader)
        assert (got.topic, got.payload, got.retained) == ("run/round/3/down/all", b"three", True)
        await reader.subscribe("run/round/3/down/all")  # asked twice: one subscription
        assert await _nothing(reader)

        broker.restart()  # every session drops; the bus connects again
        reader.connected.clear()
        await reader.wait_connected(timeout=20)
        await sender.wait_connected(timeout=20)
        # (this broker keeps nothing across a restart) subscribed again on the new connection
        await sender.publish("run/round/3/down/all", b"three again", timeout=10)
        assert (await _next(reader)).payload == b"three again"

        await reader.unsubscribe("run/round/3/down/all")
        await sender.publish("run/round/3/down/all", b"not for us", timeout=10)
        await sender.publish("other/x", b"still for us", timeout=10)
        assert (await _next(reader)).payload == b"still for us"
        assert "run/round/3/down/all" not in reader.subscriptions
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
