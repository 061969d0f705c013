"""Shared fixtures: a real mosquitto on a free loopback port; a cache for Local references.

The suite runs in pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject.toml's
addopts; docs/benchmarks/suite.md): much of its time is spent waiting on real
processes and brokers, and every test works in its own tmp dir and on its own broker
port. ``-n 0`` runs it in one process.
"""

from __future__ import annotations

import functools
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from mqttfl.provisioning.local_broker import LocalBroker

# Tests never fetch data from the network: a fetch that a test did not set up fails at
# once, from a mirror that does not exist, and keeps nothing.
os.environ.setdefault("MQTTFL_ESPECTRE_MIRROR", "/nonexistent/mqttfl-test-mirror")

# No example has a deadline: how long one takes on a loaded machine is a benchmark's
# question, and Hypothesis's default (200 ms) failed examples beside a busy suite.
# CI explores the same examples every run (a landing never depends on luck); local runs
# keep drawing new ones, which is how fuzzing finds things.
settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("local")
if os.environ.get("CI") or os.environ.get("MQTTFL_REQUIRE_SHARED_DATA"):
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a non-interactive shell (``cmd &``, as CI
    runners and ``nohup`` do) inherits SIGINT ignored, and an ignored signal stays ignored
    across exec: every process a test starts would then ignore the Ctrl-C that tests send
    it (``mqttfl run``, ``logs --follow``, ``sense``). Give SIGINT back its default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# A module that defines a fixture wider than a test (e.g. a federation trained and exported
# once for its tests) runs whole on one worker, so that it is built once, as in one process.
SHARED_FIXTURE = re.compile(r"@pytest\.fixture\(\s*scope=\"(?:module|class|package)\"")


@functools.cache
def _runs_whole(rootpath: Path, module: str) -> bool:
    path = rootpath / module
    return path.is_file() and SHARED_FIXTURE.search(path.read_text()) is not None


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: one test at a time to whichever worker is free, except the
    modules of :data:`SHARED_FIXTURE`, which go whole. (xdist's own loadgroup reads
    ``xdist_group`` marks from node ids it rewrites, which pytest 9.2 no longer lets it
    rewrite: every test would be its own group.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TestsOrWholeModules(LoadScopeScheduling):  # type: ignore[misc]  # xdist: untyped
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _runs_whole(config.rootpath, module) else nodeid

    return TestsOrWholeModules(config, log)


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
