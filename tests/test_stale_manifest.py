"""A device trains only under the manifest of the run instance it joins.

A device reads the run's retained manifest as it starts. Started a moment before its
coordinator starts the run id again (``--clear-run``), it reads the earlier instance's
manifest, then meets the new instance on the bus: it took settings that need not be the
run's (with an earlier round count it would reject every start past it and wait for
good). It stops with one line that names both instances.

As the test makes it happen, deterministically: the coordinator runs; the manifest it keeps
retained is replaced by the same settings under another instance (what a device that read
the earlier one holds); then the device starts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus
from mqttfl.nodes.manifest import await_manifest
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.wire import Topics
from mqttfl.wire.manifest import Manifest
from tests.faults import RUN_ID, TINY, Federation

pytestmark = pytest.mark.slow
EARLIER = "0123456789abcdef"


async def _plant_earlier_manifest(url: str) -> str:
    """The run's manifest again under instance EARLIER, retained; the live instance."""
    address = BrokerAddress.parse(url)
    live = await await_manifest(address, RUN_ID, credentials=None, who="test", timeout=60)
    bus = Bus(address, identifier="test-planter", subscriptions=[])
    running = asyncio.create_task(bus.run())
    try:
        await bus.wait_connected(timeout=10)
        stale = Manifest(live.config, EARLIER).encode(RUN_ID)
        await bus.publish(Topics(RUN_ID).manifest, stale, retain=True, timeout=10)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    return live.instance


def test_a_device_holding_another_instances_manifest_stops_with_one_line(
    broker: LocalBroker, tmp_path: Path
) -> None:
    settings = [*TINY, "federation.min_clients=1"]
    with Federation(tmp_path, broker, clients=1, rounds=2, overrides=settings) as fed:
        fed.start_coordinator()
        live = asyncio.run(_plant_earlier_manifest(broker.url))
        client = fed.start_client("0")
        assert client.wait(timeout=120) == 2, fed.output("0")[-3000:]
        lines = [line for line in fed.output("0").splitlines() if line.startswith("mqttfl:")]
        assert len(lines) == 1, fed.output("0")[-3000:]
        assert f"instance {live}" in lines[0]
        assert f"instance {EARLIER}" in lines[0]
        assert "start the client again" in lines[0]
        assert "Traceback" not in fed.output("0")
        assert not fed.events("0", "upload.sent")  # it trained nothing under them
