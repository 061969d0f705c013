"""Text of the view: what a hostile peer chose, made safe to show (bounded, printable);
lists of names and countdowns."""

from __future__ import annotations

from mqttfl.wire.control import Online

MAX_TEXT = 60  # characters of a site, reason or topic shown
MAX_NAMES = 12  # missing clients named before "+N more"


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


def first_names(clients: list[str], count: int) -> str:
    """The first few of ``count`` clients, then how many more."""
    if not clients:
        return "none"
    more = count - MAX_NAMES
    return ", ".join(clients[:MAX_NAMES]) + (f" +{more} more" if more > 0 else "")


def countdown(deadline: float | None, now: float, *, exact: bool) -> str:
    """Seconds left to ``deadline`` (``≤`` when it is only an upper bound)."""
    if deadline is None:
        return "-"
    left = max(deadline - now, 0.0)
    return f"{'' if exact else '≤'}{left:.0f}s"
