"""Bridged sites: two edge brokers bridged to a central one, clients on both sites.

Kill one edge broker mid-run: its bridge's last will tells the coordinator at once, the
site's clients are dropped, and no round waits out its deadline for them. Restart it: the
bridge returns and the site's clients rejoin.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mqttfl.provisioning.broker_init import BrokerSetup, init_broker
from mqttfl.provisioning.local_broker import LocalBroker, free_port
from mqttfl.provisioning.sites import EdgeBridge, bridge_identity
from tests.faults import RUN_ID, Federation, timestamp

SITES = {"kitchen": ["0", "1"], "lab": ["2", "3"]}
ROUNDS = 40  # tiny rounds (~0.2 s): enough of them to see the site leave and come back


def _edge(root: Path, central: BrokerSetup, site: str) -> BrokerSetup:
    env = central.env(bridge_identity(site))
    bridge = EdgeBridge.from_env(site, "127.0.0.1", central.port, env, source=root)
    return init_broker(
        root / f"edge-{site}", SITES[site], run_id=RUN_ID, port=free_port(), edge=bridge
    )


@pytest.mark.slow
def test_a_site_going_dark_is_dropped_at_once_and_rejoins(
    broker: LocalBroker, tmp_path: Path
) -> None:
    clients = [c for ids in SITES.values() for c in ids]
    central = init_broker(
        tmp_path / "central", clients, run_id=RUN_ID, port=free_port(), bridges=SITES
    )
    edges = {site: _edge(tmp_path, central, site) for site in SITES}
    brokers = {
        "central": LocalBroker(
            tmp_path / "run-central", port=central.port, conf=central.conf.read_text()
        )
    }
    for site, setup in edges.items():
        brokers[site] = LocalBroker(
            tmp_path / f"run-{site}", port=setup.port, conf=setup.conf.read_text()
        )
    for running in brokers.values():
        running.start()
    fed = Federation(
        tmp_path / "fed",
        brokers["central"],
        clients=len(clients),
        rounds=ROUNDS,
        broker_url=central.url,
        overrides=["federation.round_timeout_s=40", "federation.min_clients=1"],
        client_brokers={c: edges[s].url for s, ids in SITES.items() for c in ids},
    )
    try:
        with fed:
            fed.start_coordinator(env=central.env("coordinator"))
            for site, ids in SITES.items():
                for cid in ids:
                    fed.start_client(cid, env={**edges[site].env(cid), "MQTTFL_BROKER__SITE": site})
            fed.wait_round_closed(2, timeout=120)
            assert set(fed.started(3)[-1]["selected"]) == set(clients)
            killed = time.time()
            process = brokers["kitchen"].process
            assert process is not None
            process.kill()  # the building loses power
            process.wait()
            down = fed.wait_for(
                lambda: next(iter(fed.events(event="site.down")), None),
                timeout=30,
                what="site.down",
            )
            assert set(down["clients"]) == set(SITES["kitchen"])  # logged in one line

            def dropped() -> set[str]:
                reason = "site kitchen down"
                return {
                    e["client"] for e in fed.events(event="client.offline") if e["reason"] == reason
                }

            # one client.offline line per client follows site.down: wait for the last of them
            fed.wait_for(
                lambda: dropped() >= set(SITES["kitchen"]), timeout=10, what="the kitchen drops"
            )
            assert dropped() == set(SITES["kitchen"])
            after_outage = fed.last_closed() + 1
            fed.wait_round_closed(after_outage, timeout=60)
            back = time.time()
            brokers["kitchen"].start()
            rejoined = fed.wait_for(
                lambda: (
                    {
                        e["client"]: e
                        for e in fed.events(event="client.online")
                        if timestamp(e) > back
                    }
                    if {
                        e["client"]
                        for e in fed.events(event="client.online")
                        if timestamp(e) > back
                    }
                    >= set(SITES["kitchen"])
                    else None
                ),
                timeout=60,
                what="the kitchen clients to rejoin",
            )
            summary = fed.finish(timeout=300)
    finally:
        for running in brokers.values():
            running.stop()

    assert summary["rounds_completed"] == ROUNDS
    assert fed.stalled_rounds() == []  # no round waited out its deadline for the dead site
    later = [t for t in range(after_outage, ROUNDS + 1) if fed.started(t)]
    assert all(set(fed.started(t)[-1]["selected"]) >= set(SITES["lab"]) for t in later)
    rejoined_at = max(timestamp(e) for e in rejoined.values())
    # a round's clients are chosen as the round before closes (``chosen_at``), which may
    # be just before the kitchen was back though the round is announced just after
    back_in = [
        t
        for t in range(after_outage, ROUNDS + 1)
        if fed.started(t)
        and timestamp({"timestamp": fed.started(t)[-1]["chosen_at"]}) > rejoined_at
    ]
    assert back_in, "no round opened after the kitchen rejoined"
    assert set(fed.started(back_in[0])[-1]["selected"]) == set(clients)  # the kitchen is back
    figures = {
        "outage_to_dropped_s": round(timestamp(down) - killed, 3),
        "return_to_rejoined_s": round(rejoined_at - back, 3),
    }
    # The will fires as the bridge's connection closes, not after a keep-alive (60 s,
    # Mosquitto's default for bridges) or the round's deadline (40 s): a bound under both,
    # wide enough for a loaded machine; the figure itself is printed.
    assert figures["outage_to_dropped_s"] < 20
    print("FIGURES sites", json.dumps(figures))
