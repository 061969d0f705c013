"""What the coordinator writes to its run dir, and the one place that reads it back.

``checkpoint.msgpack`` (the run state after the last closed round; the one before it is
kept as ``checkpoint.prev.msgpack``), ``metrics.jsonl`` (one line per client and
round, appended) and ``summary.json``, each a typed, versioned document of
:mod:`mqttfl.engine.documents`. Whole files are written atomically and the journal is
read up to its last complete line (:mod:`mqttfl.files`); each reader checks what it reads
as the wire checks a message, so a malformed file is one :class:`~mqttfl.errors.DataError`
naming it, never a traceback in a report, an export or a resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.engine.documents import (
    ClientRow,
    Means,
    MetricsLine,
    RunSummary,
    metrics_line_text,
    read_metrics_file,
    summary_bytes,
)
from mqttfl.errors import DataError
from mqttfl.files import (
    JsonLines,
    append_line,
    keep_copy,
    one_line,
    read_bytes,
    sync_file,
    write_atomic,
)
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.ids import client_order

LAST_ROUNDS = 5  # the paper averages the last five rounds (Section VI-D)
CHECKPOINT, PREVIOUS_CHECKPOINT = "checkpoint.msgpack", "checkpoint.prev.msgpack"


class Journal:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = out_dir / CHECKPOINT
        self.previous_checkpoint_path = out_dir / PREVIOUS_CHECKPOINT
        self.metrics_path = out_dir / "metrics.jsonl"
        self.summary_path = out_dir / "summary.json"

    def save_checkpoint(self, state: dict[str, Any], *, sync: bool = True) -> None:
        """The new checkpoint; the one it replaces stays as the previous one (a fallback
        should the new one ever not decode). At every instant one of them is the newest
        saved state under its own name: the old one is kept before the new one replaces it."""
        data = pack_data(state)
        if self.checkpoint_path.exists():
            keep_copy(self.checkpoint_path, self.previous_checkpoint_path)
        write_atomic(self.checkpoint_path, data, sync=sync)

    def sync_checkpoint(self) -> None:
        sync_file(self.checkpoint_path)

    def append_metrics(self, record: MetricsLine) -> None:
        append_line(self.metrics_path, metrics_line_text(record))

    def read_metrics(self) -> tuple[list[MetricsLine], JsonLines]:
        return read_metrics_file(self.metrics_path)

    def write_summary(self, summary: RunSummary) -> None:
        write_atomic(self.summary_path, summary_bytes(summary))


def read_checkpoint(path: Path) -> Any:
    """A checkpoint's decoded map, unchecked (:func:`mqttfl.engine.documents.checkpoint_from_map`
    checks it); DataError naming the file if it is missing or does not decode."""
    raw = read_bytes(path)
    try:
        data = unpack_data(raw)
    except Exception as exc:  # msgpack raises ValueError, TypeError, its own errors...
        raise DataError(path, f"does not decode: {one_line(exc)}") from None
    return data


# --- the tables in the summary -------------------------------------------------------------
def summarize_clients(records: Iterable[MetricsLine]) -> dict[str, ClientRow]:
    """Per client: the mean of each metric over its last five reported rounds."""
    by_client: dict[str, dict[int, MetricsLine]] = {}
    for record in records:
        by_client.setdefault(record.client_id, {})[record.round] = record
    table: dict[str, ClientRow] = {}
    for client, rounds in sorted(by_client.items(), key=lambda kv: client_order(kv[0])):
        covered = sorted(rounds)[-LAST_ROUNDS:]
        last = [rounds[t] for t in covered]
        table[client] = ClientRow(
            accuracy=float(np.mean([r.accuracy for r in last])),
            f1=float(np.mean([r.f1 for r in last])),
            mae=float(np.mean([r.mae for r in last])),
            kb_sent=sum(r.bytes_up for r in rounds.values()) / 1000,
            kb_received=sum(r.bytes_down for r in rounds.values()) / 1000,
            rounds_reported=len(rounds),
            last_rounds=covered,
        )
    return table


def mean_over_clients(table: Mapping[str, Means]) -> Means:
    if not table:
        return Means(accuracy=0.0, f1=0.0, mae=0.0)
    rows = list(table.values())
    return Means(
        accuracy=float(np.mean([row.accuracy for row in rows])),
        f1=float(np.mean([row.f1 for row in rows])),
        mae=float(np.mean([row.mae for row in rows])),
    )
