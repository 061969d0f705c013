"""The coordinator's lease on a run: a retained message on ``mqttfl/{run}/lease``.

A coordinator publishes a live lease when it connects and sets a last will that marks it
gone, so the broker clears the lease the moment that coordinator's connection dies (a
crash, a power cut after the keep-alive). A second coordinator reads the lease before it
connects under the run's coordinator client id, and stops if the lease is live: it never
takes the first one's session. The text is JSON, so ``mosquitto_sub`` shows it as is.

A live lease is only a claim. The live coordinator listens on its lease topic and
answers anything there that is not its own lease by publishing its lease again, so a
second coordinator can ask (:func:`probe`, never retained) whether the holder is there;
a lease whose holder does not answer by the time its last will would have fired is
stale (or forged) and is taken over. Under `broker init`'s ACL only the coordinator's
identity may write the lease topic.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from mqttfl.errors import WireError

MAX_LEASE_BYTES = 4096
MAX_HOST_CHARS = 255


@dataclass(frozen=True)
class Lease:
    live: bool
    host: str = ""
    pid: int = 0
    since: float = 0.0  # Unix time the coordinator took the lease (shown, never computed on)

    def encode(self) -> bytes:
        body = {"live": self.live, "host": self.host, "pid": self.pid, "since": self.since}
        return json.dumps(body, sort_keys=True).encode()

    def order(self) -> tuple[float, str, int]:
        """Which of two coordinators came first (the same answer on either side)."""
        return (self.since, self.host, self.pid)

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid} on {self.host or 'an unknown host'}, since {when}"


def probe(token: str) -> bytes:
    """A question to the lease's holder (published not retained): is it there?"""
    return json.dumps({"probe": token[:64]}).encode()


def is_probe(raw: bytes) -> bool:
    return raw.startswith(b'{"probe": ') and len(raw) <= 100


def taken(host: str, pid: int) -> Lease:
    return Lease(True, host[:MAX_HOST_CHARS], pid, time.time())


def read_lease(raw: bytes) -> Lease:
    """Decode a lease from the broker (hostile until checked); WireError otherwise."""
    if len(raw) > MAX_LEASE_BYTES:
        raise WireError("size", f"a lease of {len(raw)} bytes")
    try:
        body: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError("malformed", f"lease is not JSON ({exc})") from None
    if not isinstance(body, dict) or set(body) != {"live", "host", "pid", "since"}:
        raise WireError("malformed", "a lease has exactly live, host, pid and since")
    live, host, pid, since = body["live"], body["host"], body["pid"], body["since"]
    if not isinstance(live, bool) or not isinstance(host, str) or len(host) > MAX_HOST_CHARS:
        raise WireError("type", "lease live must be true/false and host a short string")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 2**31:
        raise WireError("type", "lease pid must be a process id")
    if isinstance(since, bool) or not isinstance(since, int | float) or not math.isfinite(since):
        raise WireError("type", "lease since must be a finite number")
    if not 0 <= since <= 1e11:
        raise WireError("range", "lease since is not a plausible time")
    return Lease(live, host, pid, float(since))
