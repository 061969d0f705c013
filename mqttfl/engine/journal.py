"""What the coordinator writes to its run dir, and the one place that reads it back.

``checkpoint.msgpack`` (the run state after the last closed round; the one before it is
kept as ``checkpoint.prev.msgpack``), ``metrics.jsonl`` (one line per client and
round, appended) and ``summary.json``. Whole files are written atomically and the
journal is read up to its last complete line (:mod:`mqttfl.files`); each reader checks
what it reads as the wire checks a message (:func:`metrics_record`, :func:`read_summary`),
so a malformed file is one :class:`~mqttfl.errors.DataError` naming it, never a traceback
in a report, an export or a resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict, StrictInt, ValidationError

from mqttfl.errors import DataError, WireError
from mqttfl.files import (
    JsonLines,
    append_line,
    one_line,
    read_bytes,
    read_json,
    read_json_lines,
    sync_file,
    write_atomic,
)
from mqttfl.wire.codec import pack_data, unpack_data
from mqttfl.wire.control import Metrics, round_number
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
        should the new one ever not decode)."""
        data = pack_data(state)
        if self.checkpoint_path.exists():
            os.replace(self.checkpoint_path, self.previous_checkpoint_path)
        write_atomic(self.checkpoint_path, data, sync=sync)

    def sync_checkpoint(self) -> None:
        sync_file(self.checkpoint_path)

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_line(self.metrics_path, json.dumps(record, sort_keys=True))

    def read_metrics(self) -> tuple[list[dict[str, Any]], JsonLines]:
        return read_metrics_file(self.metrics_path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.summary_path, summary_bytes(summary))


def summary_bytes(summary: dict[str, Any]) -> bytes:
    return (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode()


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's map; DataError naming the file if it is missing or does not decode."""
    raw = read_bytes(path)
    try:
        data = unpack_data(raw)
    except Exception as exc:  # msgpack raises ValueError, TypeError, its own errors...
        raise DataError(path, f"does not decode: {one_line(exc)}") from None
    if not isinstance(data, dict):
        raise DataError(path, f"holds a {type(data).__name__}, not a checkpoint's map")
    return data


# --- metrics.jsonl ----------------------------------------------------------------------
def metrics_record(value: Any) -> dict[str, Any]:
    """One metrics line checked as the coordinator checked the message it came from
    (:class:`~mqttfl.wire.control.Metrics`); WireError saying what is wrong."""
    if not isinstance(value, dict):
        raise WireError("type", f"a {type(value).__name__}, not a metrics record")
    values = {k: v for k, v in value.items() if k not in ("round", "client_id")}
    if not isinstance(value.get("client_id"), str):
        raise WireError("type", "'client_id' is missing or not a string")
    Metrics(round_number(value.get("round"), low=1), value["client_id"], values)
    return value


def read_metrics_file(path: Path) -> tuple[list[dict[str, Any]], JsonLines]:
    """The records of a metrics.jsonl up to its last complete line (a line cut short by a
    killed coordinator is left out) and the file as read; DataError naming the file and
    line of a record that is malformed."""
    read = read_json_lines(path)
    records = []
    for number, value in read.lines:
        try:
            records.append(metrics_record(value))
        except WireError as exc:
            raise DataError(path, f"line {number}: {one_line(exc.detail)}") from None
    return records, read


# --- summary.json ----------------------------------------------------------------------
Share = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0, le=1.0)]
Gain = Annotated[float, Strict(), AllowInfNan(False), Field(ge=-1.0, le=1.0)]
# an MAE, kilobytes, bytes per client-round
Amount = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0, le=1e15)]
Count = Annotated[StrictInt, Field(ge=0)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]  # as client ids are


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Means(_Document):
    accuracy: Share
    f1: Share
    mae: Amount


class _ClientRow(_Means):
    kb_sent: Amount
    kb_received: Amount


class _Comm(_Document):
    up_bytes_per_client_round: Amount
    down_bytes_per_client_round: Amount


class _Accuracy(_Document):
    accuracy: Share


class _Gains(_Document):
    clients: dict[Name, Gain] = {}
    mean: Gain | None = None


class _Reference(_Document):
    clients: dict[Name, _Accuracy] = {}
    mean: _Accuracy | None = None
    gain: _Gains = _Gains()


class _Privacy(_Document):
    """[privacy]'s section (mqttfl/privacy/accountant.py ``privacy_summary``)."""

    delta: Annotated[float, Field(gt=0.0, lt=1.0)]
    clip: Amount
    noise_multiplier: Amount
    budget: Amount | None = None
    uploads: dict[Name, Count]
    epsilon: dict[Name, Amount]


class SummaryDocument(_Document):
    """What a reader of ``summary.json`` may rely on (:func:`mqttfl.engine.state.run_summary`
    writes it; older summaries lack ``split``, ``ordinal_labels`` and ``config``)."""

    run_id: str
    method: Name
    split: str | None = None
    ordinal_labels: bool | None = None
    rounds_completed: Count
    clients: dict[Name, _ClientRow]
    mean: _Means
    comm: _Comm
    rejections: dict[str, Count] = {}
    rejected_messages: dict[str, Count] = {}
    retries: Count = 0
    missing_uploads: Count = 0
    config: dict[str, Any] | None = None
    local_reference: _Reference | None = None
    privacy: _Privacy | None = None  # with [privacy] on


def read_summary(path: Path) -> dict[str, Any]:
    """A run's summary.json, checked against :class:`SummaryDocument`; DataError naming
    the file and the first thing wrong with it."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(path, f"holds a JSON {type(data).__name__}, not a run summary")
    try:
        SummaryDocument.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the summary"
        raise DataError(path, one_line(f"{where}: {first['msg']}")) from None
    return data


# --- the tables in the summary -------------------------------------------------------------
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
