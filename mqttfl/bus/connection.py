"""What the bus keeps of one MQTT connection: its socket's options, and the moment it drops.

:class:`~mqttfl.bus.transport.Bus` makes a new connection at every (re)connect; these are
the parts it sets up on each.
"""

from __future__ import annotations

import asyncio
import socket

import aiomqtt


def no_delay(client: aiomqtt.Client) -> None:
    """Turn Nagle's algorithm off (paho leaves it on): otherwise the tail of a message
    written right after another waits for the broker's delayed ACK, 40 ms on Linux."""
    sock = client._client.socket()  # aiomqtt has no public handle on its socket
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # a drop after the session was cancelled (a stopping fleet) is told to a future nobody
    # awaits: take note of it, or asyncio prints it at exit as never retrieved
    client._disconnected.add_done_callback(lambda done: done.cancelled() or done.exception())


class ConnectionLost:
    """Set when one connection drops. The publishes awaiting its PUBACKs all wait on one
    future (not a task each: a round's hundred downlinks are a hundred fewer tasks)."""

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._set

    def future(self) -> asyncio.Future[None]:
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self._set:
                self._future.set_result(None)
        return self._future
