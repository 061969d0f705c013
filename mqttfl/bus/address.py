"""Where the broker is (:class:`BrokerAddress`, parsed from a URL) and who logs in to it
(:class:`Credentials`)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from mqttfl.errors import BrokerError


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
    origin: str = ""  # where they come from, for the line that says the broker refused them
