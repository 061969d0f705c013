"""The run manifest at the edges of a run: made by its coordinator, awaited by a device,
compared with a device's own config, and turned into the config the device trains.

A device of a deployment needs its id, its credentials and the broker's URL: the rest of
the run's contract (method, model, rounds, data, wire and privacy) comes from the
manifest its coordinator keeps retained (:mod:`mqttfl.wire.manifest`). A device given a
config of its own is checked against it before it publishes anything: every key that
differs, other than the device's own (:data:`DEVICE_KEYS` and the run's
``federation.device_keys``), is named with both values, and the device stops.
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mqttfl.bus.address import BrokerAddress, Credentials
from mqttfl.bus.transport import Bus
from mqttfl.config import RunConfig, config_from_tree
from mqttfl.errors import DataError, StateError, UsageError, WireError
from mqttfl.files import write_atomic
from mqttfl.logs import get_logger
from mqttfl.wire import Topics
from mqttfl.wire.manifest import Manifest, read_manifest

#: A device's own business: how it connects and logs, where its data lies, its threads.
DEVICE_KEYS = ("broker", "logging", "data.path", "train.torch_threads")
WAITING_NOTE_S = 2.0  # say that we wait once the manifest has not come this soon
MANIFEST_FILE = "manifest.json"


def manifest_of(config: RunConfig, instance: str) -> Manifest:
    """The coordinator's manifest of its run: the resolved config without [broker]."""
    return Manifest(config.recorded(), instance)


def flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to values, as a user names them (``method.tau`` for the [method] table)."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        name = "method." if not prefix and key == "method_params" else f"{prefix}{key}."
        if isinstance(value, Mapping) and value:
            found.update(flat(value, name))
        else:
            found[name[:-1]] = value
    return found


def device_keys(run: Mapping[str, Any]) -> tuple[str, ...]:
    declared = flat(run).get("federation.device_keys") or []
    return (*DEVICE_KEYS, *(str(k) for k in declared))


def _own(key: str, keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in keys)


def _shown(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)[:60]


def drift(local: RunConfig, manifest: Manifest, *, only: set[str] | None = None) -> list[str]:
    """Each key (of ``only``, when given) whose value differs between the device's
    config and the run's, as ``key: VALUE here, VALUE in the run``."""
    mine, theirs = flat(local.recorded()), flat(manifest.config)
    keys = device_keys(manifest.config)
    found = []
    for key in sorted(mine.keys() | theirs.keys()):
        if _own(key, keys) or (only is not None and not _own(key, tuple(only))):
            continue
        if mine.get(key) != theirs.get(key):
            found.append(
                f"{key}: {_shown(mine.get(key))} here, {_shown(theirs.get(key))} in the run"
            )
    return found


def set_keys(overrides: list[str]) -> set[str]:
    """The dotted keys a device's ``--set`` options name."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    return {k.replace("method_params.", "method.", 1) for k in keys}


def device_config(
    manifest: Manifest, local: RunConfig, *, from_file: bool, overrides: list[str]
) -> RunConfig:
    """The config a device trains: the run's, with the device's own keys from its own
    config (the run's ``federation.device_keys`` only where the device set them).
    UsageError naming every key in which the device's own settings differ from the run's."""
    run_id = str(manifest.config.get("run_id"))
    differ = drift(local, manifest, only=None if from_file else set_keys(overrides))
    if differ:
        raise UsageError(
            f"the settings given here differ from the manifest of run {run_id!r} (its coordinator's "
            f"config): {'; '.join(differ)}. Start it without --config and --set to train the "
            "run's settings, or make them agree (a device may set only "
            f"{', '.join(device_keys(manifest.config))})"
        )
    tree: dict[str, Any] = copy.deepcopy(dict(manifest.config))
    mine = local.model_dump(mode="json")
    given = set_keys(overrides)
    for key in device_keys(manifest.config):
        table, _, name = key.partition(".")
        if key not in DEVICE_KEYS and not from_file and key not in given:
            continue  # a key the run lets devices set, which this one did not
        if not name:
            tree[table] = mine[table]
        else:
            tree.setdefault(table, {})[name] = mine[table][name]
    return config_from_tree(tree, f"run {run_id!r}'s manifest")


async def await_manifest(
    address: BrokerAddress,
    run_id: str,
    *,
    credentials: Credentials | None,
    who: str,
    timeout: float,
    connect_timeout: float = 10.0,
    probe: str | None = None,
) -> Manifest:
    """The run's manifest as its coordinator keeps it retained: waits up to ``timeout``
    seconds for it, saying so once; StateError if none comes.

    A broker drops what an identity may not read without a word, so a device whose ACL
    does not cover the run would wait in vain: when the manifest is not there at once,
    ``probe`` (the device's own status topic) gets an empty retained message, which the
    broker refuses (one line, exit 2) unless this identity belongs to the run. A live
    coordinator answers it with the manifest again: a broker whose retained store is
    node-local (a RabbitMQ cluster) keeps the manifest only on the coordinator's node."""
    topics = Topics(run_id)
    log = get_logger(run_id=run_id)
    bus = Bus(
        address,
        identifier=f"mqttfl-{run_id}-manifest-{secrets.token_hex(4)}",
        subscriptions=[topics.manifest],
        credentials=credentials,
        who=who,
        connect_timeout_s=connect_timeout,
        events="manifest",
    )
    began = time.monotonic()

    async def first() -> Manifest:
        await bus.wait_connected(timeout=connect_timeout)
        noted = False
        while True:
            left = began + timeout - time.monotonic()
            wait = min(left, WAITING_NOTE_S) if not noted else left
            try:
                message = await asyncio.wait_for(bus.incoming.get(), timeout=max(wait, 0.0))
            except TimeoutError:
                if time.monotonic() - began >= timeout:
                    raise StateError(
                        f"run {run_id!r} has no manifest on {address} after {timeout:.0f} s: "
                        "is its coordinator started (it publishes the run's settings), and "
                        "is the run id right?"
                    ) from None
                noted = True
                log.info("manifest.waiting", broker=str(address), timeout_s=timeout)
                if probe is not None:
                    await bus.publish(probe, b"", retain=True, timeout=connect_timeout)
                continue
            if not message.payload:
                continue  # a cleared manifest (a run cleared to start afresh)
            try:
                return read_manifest(message.payload, run_id=run_id)
            except WireError as exc:
                log.warning("manifest.rejected", reason=exc.reason, detail=exc.detail)

    found: list[Manifest | StateError] = []

    async def look() -> None:
        try:
            found.append(await first())
        except StateError as exc:  # raised outside the task group: not an ExceptionGroup
            found.append(exc)

    async with asyncio.TaskGroup() as group:
        running = group.create_task(bus.run())
        try:
            await look()
        finally:
            running.cancel()
    [manifest] = found
    if isinstance(manifest, StateError):
        raise manifest
    log.info("manifest.received", instance=manifest.instance, digest=manifest.digest[:16])
    return manifest


def keep_copy(manifest: Manifest, directory: Path) -> Path:
    """Write the manifest beside a device's state (or a run's files), for readers later
    (``mqttfl export`` on the device) that have no broker to ask."""
    path = directory / MANIFEST_FILE
    body = {"instance": manifest.instance, "digest": manifest.digest, "config": manifest.config}
    write_atomic(path, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())
    return path


def kept_manifest(directory: Path) -> Manifest | None:
    """The manifest kept in ``directory`` (a device's folder of the run, where
    :func:`keep_copy` wrote the one it took its settings from); None without a readable one."""
    try:
        return read_copy(directory / MANIFEST_FILE)
    except DataError:
        return None


def follow_instance(
    kept: Manifest, instance: str, settings: str, directory: Path, *, client_id: str
) -> Manifest:
    """The manifest a device goes on with once the run says it is ``instance`` with
    ``settings`` (its manifest's digest): the kept one, renewed under the new instance
    and kept in its place where the settings are the same (the coordinator started the
    run id again unchanged); StateError, one line, where they differ or the run does
    not say them."""
    if not instance or instance == kept.instance:
        return kept
    if settings != kept.digest:
        run_id = str(kept.config.get("run_id", ""))
        raise StateError(
            f"run {run_id!r} is now instance {instance}, and client {client_id!r} took other "
            f"settings from the manifest of instance {kept.instance} (its coordinator started "
            "the run again since): start the client again to take the run's settings now"
        )
    renewed = Manifest(kept.config, instance)
    keep_copy(renewed, directory)
    return renewed


def read_copy(path: Path) -> Manifest:
    """A kept manifest; DataError naming the file and what is wrong with it."""
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(path, "no manifest here") from None
    except (OSError, ValueError) as exc:
        raise DataError(path, f"unreadable manifest: {exc}") from None
    if not isinstance(body, dict) or not {"instance", "digest", "config"} <= body.keys():
        raise DataError(path, "not a manifest (instance, digest and config)")
    try:
        return Manifest(body["config"], body["instance"], body["digest"])
    except WireError as exc:
        raise DataError(path, f"not a valid manifest: {exc.detail}") from None
