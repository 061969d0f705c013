"""A device trains only under the settings of the run instance it joins.

A device reads the run's retained manifest as it starts. Started a moment before its
coordinator starts the run id again (``--clear-run``), it reads the earlier instance's
manifest, then meets the new instance on the bus. The run's state names the digest of its
manifest: where the settings the device holds are the same, it goes on under the new
instance; where they differ (with an earlier round count it would reject every start past
it and wait for good), it stops with one line that names both instances.

As the tests make it happen, deterministically: the coordinator runs; the manifest it keeps
retained is replaced by one under another instance (what a device that read the earlier
one holds), with the same settings or other ones; then the device starts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus
from mqttfl.nodes.manifest import MANIFEST_FILE, await_manifest
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from mqttfl.wire.manifest import Manifest
from tests.faults import RUN_ID, TINY, Federation

pytestmark = pytest.mark.slow
EARLIER = "0123456789abcdef"
SETTINGS = [*TINY, "federation.min_clients=1"]


async def _plant_earlier_manifest(url: str, changes: Mapping[str, Any]) -> str:
    """The run's manifest again under instance EARLIER, with ``changes`` to its settings,
    retained; the live instance."""
    address = BrokerAddress.parse(url)
    live = await await_manifest(address, RUN_ID, credentials=None, who="test", timeout=60)
    bus = Bus(address, identifier="test-planter", subscriptions=[])
    running = asyncio.create_task(bus.run())
    try:
        await bus.wait_connected(timeout=10)
        stale = Manifest({**live.config, **changes}, EARLIER).encode(RUN_ID)
        await bus.publish(Topics(RUN_ID).manifest, stale, retain=True, timeout=10)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    return live.instance


def test_a_device_holding_other_settings_of_another_instance_stops_with_one_line(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path, broker, clients=1, rounds=2, overrides=SETTINGS) as fed:
        fed.client_overrides["0"] = ["rounds=3"]  # the device's own config is the planted one
        fed.start_coordinator()
        live = asyncio.run(_plant_earlier_manifest(broker.url, {"rounds": 3}))
        client = fed.start_client("0")
        assert client.wait(timeout=120) == 2, fed.output("0")[-3000:]
        lines = [line for line in fed.output("0").splitlines() if line.startswith("mqttfl:")]
        assert len(lines) == 1, fed.output("0")[-3000:]
        assert f"instance {live}" in lines[0]
        assert f"instance {EARLIER}" in lines[0]
        assert "start the client again" in lines[0]
        assert "Traceback" not in fed.output("0")
        assert not fed.events("0", "upload.sent")  # it trained nothing under them


def test_a_device_holding_the_same_settings_of_another_instance_goes_on_under_the_new_one(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with Federation(tmp_path, broker, clients=1, rounds=2, overrides=SETTINGS) as fed:
        fed.start_coordinator()
        live = asyncio.run(_plant_earlier_manifest(broker.url, {}))
        fed.start_client("0")
        fed.finish(timeout=180)
        renewed = fed.events("0", "manifest.renewed")
        assert [(e["previous"], e["instance"]) for e in renewed] == [(EARLIER, live)]
        assert [e["round"] for e in fed.events("0", "upload.sent")] == [1, 2]
        kept = json.loads((fed.state_dir / RUN_ID / MANIFEST_FILE).read_text())
        assert kept["instance"] == live  # what `mqttfl export` on the device reads
