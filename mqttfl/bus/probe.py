"""A short look at what the broker holds for a run, on a connection of its own.

The coordinator looks before it connects under the run's coordinator client id (which
would take a live coordinator's session over): the retained lease says whether another
coordinator is live, the retained state whether the run id belongs to a finished run.
"""

from __future__ import annotations

import asyncio
import secrets

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus


async def read_retained(
    address: BrokerAddress,
    filters: list[str],
    *,
    marker_topic: str,
    credentials: Credentials | None = None,
    who: str,
    identifier: str,
    timeout: float,
) -> dict[str, bytes]:
    """The retained messages under ``filters`` (topic: payload, empty ones left out).

    A broker sends a subscription's retained messages right after its SUBACK, on the
    same connection, so once a marker published afterwards comes back to us, every
    retained message has arrived before it.
    """
    token = secrets.token_hex(8)
    marker = f"{marker_topic}/{token}"
    bus = Bus(
        address,
        identifier=f"{identifier}-{token[:6]}",
        subscriptions=[*filters, marker],
        credentials=credentials,
        who=who,
        connect_timeout_s=timeout,
        events="lookup",
    )
    found: dict[str, bytes] = {}

    async def collect() -> None:
        await bus.wait_connected(timeout=timeout)
        await bus.publish(marker, token.encode(), timeout=timeout)
        while True:
            message = await bus.incoming.get()
            if message.topic == marker and message.payload == token.encode():
                return
            if message.retained and message.payload:
                found[message.topic] = message.payload

    async with asyncio.TaskGroup() as group:
        running = group.create_task(bus.run())
        try:
            await collect()
        finally:
            running.cancel()
    return found


async def clear_retained(
    address: BrokerAddress,
    topics: list[str],
    *,
    credentials: Credentials | None = None,
    who: str,
    identifier: str,
    timeout: float,
) -> None:
    """Publish an empty retained message to each topic (the broker then forgets it)."""
    bus = Bus(
        address,
        identifier=f"{identifier}-{secrets.token_hex(3)}",
        subscriptions=[],
        credentials=credentials,
        who=who,
        connect_timeout_s=timeout,
        events="lookup",
    )
    async with asyncio.TaskGroup() as group:
        running = group.create_task(bus.run())
        try:
            await bus.wait_connected(timeout=timeout)
            await asyncio.gather(
                *(bus.publish(topic, b"", retain=True, timeout=timeout) for topic in topics)
            )
        finally:
            running.cancel()
