"""The run manifest: the run's resolved configuration, published by its coordinator as a
retained message on ``mqttfl/<run>/manifest``, so that every other process of the run
(a device started by hand or by a service, a watcher, an export) takes the run's contract
from the run itself rather than from a copy of a config file that may have drifted.

It carries the configuration as the coordinator resolved it (its file with every
``--set``, after validation), never its ``[broker]`` table (credentials, how to connect),
with a SHA-256 digest of it and the run instance (:class:`~mqttfl.wire.control.RunStatus`).
Like every message it is hostile until read here: bounded in size and depth, its digest
checked against its content, its version one this code reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mqttfl.errors import WireError
from mqttfl.wire.codec import Message, encode
from mqttfl.wire.control import COORDINATOR, read_envelope, run_instance

MANIFEST_VERSION = 1
MANIFEST_LIMIT = 256 * 1024  # a config is a few kB
MAX_DEPTH = 6


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the configuration's canonical JSON."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _plain(name: str, value: Any, depth: int = 0) -> None:
    """What a TOML config holds: maps of string keys, lists, strings, numbers, booleans."""
    if depth > MAX_DEPTH:
        raise WireError("malformed", f"'{name}' nests deeper than {MAX_DEPTH}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or not 0 < len(key) <= 64:
                raise WireError("type", f"'{name}' has a key that is not a short string")
            _plain(f"{name}.{key}", item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _plain(name, item, depth + 1)
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise WireError("type", f"'{name}' holds a {type(value).__name__}")


@dataclass(frozen=True)
class Manifest:
    """Run ``config["run_id"]``'s contract: its configuration and instance."""

    config: Mapping[str, Any]
    instance: str
    digest: str = ""
    version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.config, Mapping):
            raise WireError("type", "a manifest's config must be a map")
        _plain("config", self.config)
        run_instance(self.instance)
        if not self.instance:
            raise WireError("missing_field", "a manifest names its run instance")
        try:
            digest = config_digest(self.config)
        except ValueError:  # NaN or Inf: no config holds one
            raise WireError("non_finite", "a manifest's config holds NaN or Inf") from None
        if not self.digest:
            object.__setattr__(self, "digest", digest)
        elif self.digest != digest:
            raise WireError("digest", "the manifest's digest does not match its config")

    def encode(self, run: str) -> bytes:
        body = {
            "version": self.version,
            "instance": self.instance,
            "digest": self.digest,
            "config": dict(self.config),
        }
        return encode(Message("manifest", run, 0, COORDINATOR, body))


def read_manifest(raw: bytes, *, run_id: str) -> Manifest:
    message = read_envelope(
        raw, "manifest", run_id, sender=COORDINATOR, round=0, max_bytes=MANIFEST_LIMIT
    )
    body = message.body
    if not isinstance(body, Mapping):
        raise WireError("type", "a manifest must be a map")
    if body.get("version") != MANIFEST_VERSION:
        raise WireError(
            "version",
            f"manifest version {str(body.get('version'))[:20]!r}; this mqttfl reads "
            f"{MANIFEST_VERSION} (are coordinator and device the same mqttfl version?)",
        )
    missing = sorted({"instance", "digest", "config"} - body.keys())
    if missing:
        raise WireError("missing_field", f"the manifest lacks {missing}")
    digest = body["digest"]
    if not isinstance(digest, str) or len(digest) != 64:
        raise WireError("type", "'digest' must be 64 hex digits")
    config = body["config"]
    if isinstance(config, Mapping) and config.get("run_id") != run_id:
        raise WireError("run", "the manifest's config is of another run id")
    return Manifest(config, body["instance"], digest)
