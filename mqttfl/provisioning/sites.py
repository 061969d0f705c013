"""Bridged sites: an edge Mosquitto per building, bridged to the central broker.

Clients connect to their site's edge broker; the coordinator connects to the central
one. Each edge broker runs Mosquitto's own bridge to the central broker under a bridge
identity (``site-<name>``) that the central ACL limits to that site's clients:

    out  status, ack, up, metrics of the site's clients   (QoS 1)
    in   start, state, the broadcast downlink and the site's personal downlinks (QoS 1)

The bridge announces itself on ``mqttfl/<run>/site/<name>`` (``1``), and leaves its last
will there (``0``): when the edge broker or its uplink dies, the central broker publishes
the will at once, and the coordinator drops every client of that site instead of waiting
out the round's deadline. When the bridge returns, the clients reconnect to their edge
broker and announce themselves again.

``mqttfl broker init --bridge kitchen=0,1 ...`` writes the central side (a bridge identity
and its ACL per site); ``mqttfl broker init --site kitchen --central URL
--bridge-credentials central/credentials/site-kitchen.env ...`` writes an edge broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mqttfl.errors import FileError, UsageError
from mqttfl.wire import BROADCAST, check_id

BRIDGE_PREFIX = "site-"


def bridge_identity(site: str) -> str:
    return BRIDGE_PREFIX + check_id(site, "site")


def parse_bridges(items: list[str]) -> dict[str, list[str]]:
    """``["kitchen=0,1", "lab=2,3"]`` -> ``{"kitchen": ["0", "1"], "lab": ["2", "3"]}``."""
    bridges: dict[str, list[str]] = {}
    for item in items:
        site, sep, ids = item.partition("=")
        if not sep or not ids.strip():
            raise UsageError(f"--bridge {item!r} must look like SITE=ID,ID,...")
        check_id(site.strip(), "site")
        if site.strip() in bridges:
            raise UsageError(f"--bridge names site {site.strip()!r} twice")
        bridges[site.strip()] = [check_id(c.strip()) for c in ids.split(",")]
    return bridges


def _base(run_id: str | None) -> str:
    if not run_id:
        raise UsageError("bridged sites need --run-id (the bridge's topics name the run)")
    return f"mqttfl/{check_id(run_id, 'run id')}"


def bridged_topics(site: str, clients: list[str], run_id: str | None) -> list[tuple[str, str]]:
    """(topic, direction) of everything a site's bridge carries: ``out`` to the central
    broker, ``in`` from it. The central ACL and the edge's bridge are both made from it."""
    base = _base(run_id)
    topics = [(f"{base}/state", "in"), (f"{base}/round/+/start", "in")]
    # the run's settings, and whether it has a live coordinator (a device reads both)
    topics += [(f"{base}/manifest", "in"), (f"{base}/lease", "in")]
    topics.append((f"{base}/round/+/down/{BROADCAST}", "in"))
    for client in clients:
        topics += [
            (f"{base}/{kind}", "out")
            for kind in (
                f"status/{client}",
                f"round/+/ack/{client}",
                f"round/+/up/{client}",
                f"round/+/metrics/{client}",
            )
        ]
        topics.append((f"{base}/round/+/down/{client}", "in"))
    return topics


def bridge_acl(site: str, clients: list[str], run_id: str | None) -> list[str]:
    """The central ACL of one site's bridge: what it carries, and its own notice (where
    its will lands)."""
    lines = [f"user {bridge_identity(site)}", f"topic write {_base(run_id)}/site/{site}"]
    for topic, direction in bridged_topics(site, clients, run_id):
        lines.append(f"topic {'write' if direction == 'out' else 'read'} {topic}")
    return [*lines, ""]


@dataclass(frozen=True)
class EdgeBridge:
    """What an edge broker needs to bridge to the central one."""

    site: str
    central_host: str
    central_port: int
    username: str
    password: str
    ca_file: str | None = None  # the central broker's CA, for an mqtts:// central

    @classmethod
    def from_env(
        cls, site: str, host: str, port: int, env: dict[str, str], *, source: Path
    ) -> EdgeBridge:
        try:
            username, password = env["MQTTFL_BROKER__USERNAME"], env["MQTTFL_BROKER__PASSWORD"]
        except KeyError as exc:
            raise FileError(f"{source}: lacks {exc.args[0]}") from None
        if username != bridge_identity(site):
            raise FileError(
                f"{source} holds {username!r}'s credentials, not {bridge_identity(site)!r}'s"
            )
        return cls(site, host, port, username, password, env.get("MQTTFL_BROKER__TLS_CA"))


def bridge_conf(bridge: EdgeBridge, clients: list[str], run_id: str | None) -> list[str]:
    """The edge broker's bridge section (mosquitto.conf)."""
    base = _base(run_id)
    site = bridge.site
    lines = [
        "",
        f"# The bridge of site {site} to the central broker (written by `mqttfl broker init --site`).",
        f"connection mqttfl-{site}",
        f"address {bridge.central_host}:{bridge.central_port}",
        f"remote_clientid mqttfl-bridge-{run_id}-{site}",
        f"remote_username {bridge.username}",
        f"remote_password {bridge.password}",
        # A site that was down rejoins at the run's current state (its retained topics);
        # the rounds it missed are not replayed to it as if they were fresh.
        "cleansession true",
        "try_private true",
        "restart_timeout 1 5",
        "notifications true",
        "notifications_local_only false",
        f"notification_topic {base}/site/{site}",
    ]
    if bridge.ca_file:
        lines += [f"bridge_cafile {bridge.ca_file}", "bridge_insecure false"]
    lines += [
        f"topic {topic} {direction} 1" for topic, direction in bridged_topics(site, clients, run_id)
    ]
    return lines
