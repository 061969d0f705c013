"""A stopping process says its one line and nothing after it.

A fleet that meets a refusal cancels every other client's session; paho then reports the
drops of their connections to futures nobody awaits any more, and asyncio printed each
as "Future exception was never retrieved" on stderr at exit, under the command's one
line. As the fleet does it, in a process of its own: twenty connected sessions are
cancelled as their broker dies.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

SCRIPT = """
import asyncio, gc, os, signal, sys
from pathlib import Path
from mqttfl.bus.address import BrokerAddress
from mqttfl.bus.transport import Bus
from mqttfl.provisioning.local_broker import LocalBroker

async def main(broker):
    address = BrokerAddress.parse(broker.url)
    buses = [Bus(address, identifier=f"exit-{i}", subscriptions=["x/#"]) for i in range(20)]
    sessions = [asyncio.create_task(bus.run()) for bus in buses]
    for bus in buses:
        await bus.wait_connected(timeout=10)
    os.kill(broker.process.pid, signal.SIGKILL)
    for session in sessions:
        session.cancel()
    await asyncio.gather(*sessions, return_exceptions=True)
    await asyncio.sleep(0.5)

with LocalBroker(Path(sys.argv[1])) as broker:
    asyncio.run(main(broker))
gc.collect()
"""


def test_sessions_cancelled_as_their_broker_dies_print_nothing(tmp_path: Path) -> None:
    for attempt in range(3):  # the drop must land after the cancel: not every time
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path / f"broker-{attempt}")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "never retrieved" not in done.stderr, done.stderr[-3000:]
