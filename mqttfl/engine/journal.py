"""What the coordinator writes to its run dir: checkpoint, metrics.jsonl, summary.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import numpy as np

from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.ids import client_order

LAST_ROUNDS = 5  # the paper averages the last five rounds (Section VI-D)


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` in one step. Unsynced, the new file survives our process dying
    (it is in the page cache) but not the machine losing power until :func:`sync_file`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        if sync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def sync_file(path: Path) -> None:
    """fsync a file and its directory entry (after an unsynced :func:`write_atomic`)."""
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Journal:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = out_dir / "checkpoint.msgpack"
        self.metrics_path = out_dir / "metrics.jsonl"
        self.summary_path = out_dir / "summary.json"

    def save_checkpoint(self, state: dict[str, Any], *, sync: bool = True) -> None:
        write_atomic(self.checkpoint_path, pack_data(state), sync=sync)

    def sync_checkpoint(self) -> None:
        sync_file(self.checkpoint_path)

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint_path.exists():
            return None
        return cast("dict[str, Any] | None", unpack_data(self.checkpoint_path.read_bytes()))

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        with open(self.metrics_path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(
            self.summary_path, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode()
        )


def summarize_clients(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per client: the mean of each metric over its last five reported rounds."""
    by_client: dict[str, dict[int, dict[str, Any]]] = {}
    for record in records:
        by_client.setdefault(str(record["client_id"]), {})[int(record["round"])] = record
    table: dict[str, dict[str, float]] = {}
    for client, rounds in sorted(by_client.items(), key=lambda kv: client_order(kv[0])):
        last = [rounds[t] for t in sorted(rounds)[-LAST_ROUNDS:]]
        table[client] = {
            key: float(np.mean([r[key] for r in last])) for key in ("accuracy", "f1", "mae")
        }
        table[client]["kb_sent"] = sum(r.get("bytes_up", 0) for r in rounds.values()) / 1000
        table[client]["kb_received"] = sum(r.get("bytes_down", 0) for r in rounds.values()) / 1000
        table[client]["rounds_reported"] = len(rounds)
    return table


def mean_over_clients(table: dict[str, dict[str, float]]) -> dict[str, float]:
    if not table:
        return {"accuracy": 0.0, "f1": 0.0, "mae": 0.0}
    return {
        k: float(np.mean([row[k] for row in table.values()])) for k in ("accuracy", "f1", "mae")
    }
