"""Shared fixture: a real mosquitto on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqttfl.runtime.broker import LocalBroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    with LocalBroker(tmp_path / "broker") as running:
        yield running
