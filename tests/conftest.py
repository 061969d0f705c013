"""Shared fixtures: a real mosquitto on a free loopback port; a cache for Local references."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from mqttfl.provisioning.local_broker import LocalBroker

# CI explores the same examples every run (a landing never depends on luck); local runs
# keep drawing new ones, which is how fuzzing finds things.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") or os.environ.get("MQTTFL_REQUIRE_SHARED_DATA"):
    settings.load_profile("ci")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    with LocalBroker(tmp_path / "broker") as running:
        yield running


@pytest.fixture(scope="session", autouse=True)
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`mqttfl run`'s Local references go to a cache of this session (inherited by the
    command lines the tests start), never to the user's ~/.cache."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MQTTFL_CACHE_DIR", str(cache))
        yield cache
