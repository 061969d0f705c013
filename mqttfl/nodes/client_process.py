"""One client device's whole life in this process: its shard, its runner, its exit code.

`mqttfl client` runs it once; `mqttfl clients` (:mod:`mqttfl.nodes.forks`) runs it in
each process it forks. Torch loads after the shard is built, so the simulator's arrays
peak below torch's floor and go back to the OS before training starts. Once the runner
is built, everything alive is frozen out of the garbage collector's generations: the
collector then never walks torch's hundreds of thousands of module objects again.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.config import RunConfig
from mqttfl.data.shard import Shard
from mqttfl.errors import MqttflError, StateError
from mqttfl.pidfile import findable_client


def run_client_device(
    config: RunConfig,
    client_id: str,
    broker: BrokerAddress,
    *,
    state_dir: Path,
    credentials: Credentials | None,
    shard_dir: Path | None = None,
    shard: Shard | None = None,
) -> int:
    """Build ``client_id``'s shard (unless given, built for this config) and runner and
    run it to the end of the run, in a process named for the client, with a pid file
    (:mod:`mqttfl.pidfile`)."""
    with findable_client(state_dir, config.run_id, client_id):
        return _run_device(config, client_id, broker, state_dir, credentials, shard_dir, shard)


def _run_device(
    config: RunConfig,
    client_id: str,
    broker: BrokerAddress,
    state_dir: Path,
    credentials: Credentials | None,
    shard_dir: Path | None,
    shard: Shard | None,
) -> int:
    from mqttfl.data.sources import run_client_shard
    from mqttfl.training.memory import release

    if shard is None:
        shard = run_client_shard(config, client_id, shard_dir)
    release(collect=True)
    from mqttfl.nodes.client import ClientRunner

    try:
        runner = ClientRunner(
            config, client_id, broker, shard, state_dir=state_dir, credentials=credentials
        )
    except MqttflError:
        raise
    except Exception as exc:
        saved = (
            sorted(str(p) for p in state_dir.glob(f"*{client_id}*")) if state_dir.is_dir() else []
        )
        where = f"; --state-dir {state_dir} holds {', '.join(saved)[:200]}" if saved else ""
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise StateError(
            f"client {client_id!r} could not start ({type(exc).__name__}: {detail}){where}: "
            "state saved by another config or run? Move it aside or give this run its own "
            "--state-dir"
        ) from None
    # What exists now lives as long as the process: out of the collector's sight, so
    # that its collections stay cheap (and, in a forked child, leave shared pages alone).
    gc.collect()
    gc.freeze()
    return asyncio.run(runner.run())
