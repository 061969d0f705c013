"""A client's connection to the broker: its identity, what it subscribes to, its birth and
its last will."""

from __future__ import annotations

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus
from mqttfl.config import RunConfig
from mqttfl.wire import Topics
from mqttfl.wire.control import Offline


def client_bus(
    config: RunConfig,
    client_id: str,
    broker: BrokerAddress,
    online: bytes,
    *,
    credentials: Credentials | None,
    fetch_broadcasts: bool,
) -> Bus:
    """``client_id``'s bus, announcing ``online`` (retained) on every connect. With
    ``fetch_broadcasts`` it subscribes to no round's broadcast until the round machine asks
    for one (:meth:`~mqttfl.nodes.client_machine.ClientRounds.fetches`)."""
    topics = Topics(config.run_id)
    subscriptions = [
        topics.any_start,
        *([] if fetch_broadcasts else [topics.any_down_all]),
        topics.any_down_for(client_id),
        topics.state,
        topics.status(client_id),  # to answer a forged 'offline' about us
        topics.lease,  # whether the run has a live coordinator (client_watch)
    ]
    return Bus(
        broker,
        identifier=f"mqttfl-{config.run_id}-client-{client_id}",
        subscriptions=subscriptions,
        will=(
            topics.status(client_id),
            Offline(client_id, "connection lost").encode(config.run_id),
        ),
        birth=lambda: [(topics.status(client_id), online, True)],
        credentials=credentials,
        keepalive_s=config.broker.keepalive_s,
        connect_timeout_s=config.broker.connect_timeout_s,
        max_message_bytes=config.broker.max_message_bytes,
        who=f"client {client_id!r}",
    )
