"""Text a hostile peer chose, made safe to show: bounded, printable."""

from __future__ import annotations

from mqttfl.wire.control import Online

MAX_TEXT = 60  # characters of a site, reason or topic shown


def clean(value: object, limit: int = MAX_TEXT) -> str:
    """Printable text of at most ``limit`` characters: a hostile string may carry terminal
    escapes (cells are rich ``Text``, so markup in it stays literal)."""
    text = str(value)
    shown = "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
    return shown + ("…" if len(text) > limit else "")


def status_site(status: Online) -> str | None:
    """The site a status names, if the wire carries one (an optional ``site`` on the
    status or its client info); anything but a non-empty string is ignored."""
    for holder in (status, status.info):
        site = getattr(holder, "site", None)
        if isinstance(site, str) and site:
            return clean(site, 32)
    return None
