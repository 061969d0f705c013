"""Client ids: what a topic level may hold, and the number and order an id stands for."""

from __future__ import annotations

import re
import zlib

from mqttfl.errors import WireError

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
BROADCAST = "all"  # the downlink topic level every client reads; never a client's id
#: what the pattern lets through but a file name must not be: client state is kept in
#: ``<state dir>/<run id>/client-<id>.pt``
DOT_NAMES = (".", "..")


def check_id(value: str, what: str = "client id") -> str:
    """An id is safe inside a topic level (no '/', '+', '#', not the broadcast name) and
    as a path component (not '.' or '..')."""
    if (
        not isinstance(value, str)
        or not _ID.fullmatch(value)
        or value == BROADCAST
        or value in DOT_NAMES
    ):
        raise WireError(
            "bad_id",
            f"{what} {str(value)[:80]!r} must match {_ID.pattern} and not be 'all', '.' or '..'",
        )
    return value


def is_numeric_id(client: str) -> bool:
    """Client ids made of ASCII digits pick a synthetic room, a partition or a chip."""
    return client.isascii() and client.isdigit()


def client_number(client: str) -> int:
    """A stable integer for a client id: the number itself for numeric ids (they pick the
    synthetic room and seed), else a CRC32 of the id (the same on every device)."""
    return int(client) if is_numeric_id(client) else zlib.crc32(client.encode())


def client_order(client: str) -> tuple[int, str]:
    """Sort key: numeric ids in numeric order, then the others by name."""
    return (int(client), "") if is_numeric_id(client) else (1 << 62, client)
