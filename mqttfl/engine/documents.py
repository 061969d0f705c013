"""The documents one room writes and another reads, typed and versioned, in one module.

- :class:`RunSummary`: ``summary.json``, the run's result (tables, reports, compare);
- :class:`MetricsLine`: a line of ``metrics.jsonl`` (a client's scores after a round);
- :class:`Checkpoint`: ``checkpoint.msgpack``, what a restarted coordinator goes on from;
- :class:`CompareRow` in :class:`CompareDocument`: ``compare.json``'s rows.

Each is a frozen pydantic model with a ``version``. A file from before versions is version
1; a version this code does not know is refused in one line naming the file and the
version (:func:`known_version`). Unknown keys are kept (``extra="allow"``). Writers go
through :func:`summary_bytes`, :func:`metrics_line_text`, :meth:`Checkpoint.to_map` and
:func:`compare_bytes`, readers through :func:`read_summary`, :func:`read_metrics_file`,
:func:`checkpoint_from_map` and :func:`read_compare`; a malformed file is one
:class:`~mqttfl.errors.DataError` naming it and the first thing wrong, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBytes,
    StrictInt,
    ValidationError,
)

from mqttfl.errors import DataError, StateError, WireError
from mqttfl.files import JsonLines, one_line, read_json, read_json_lines
from mqttfl.wire.control import Metrics, round_number
from mqttfl.wire.topics import MAX_ROUND

__all__ = [
    "CHECKPOINT_VERSION",
    "COMPARE_VERSION",
    "METRICS_VERSION",
    "SUMMARY_VERSION",
    "BufferedBlock",
    "Checkpoint",
    "ClientRow",
    "CompareDocument",
    "CompareRow",
    "CompareRun",
    "Gains",
    "LocalReferenceBlock",
    "MeanStd",
    "Means",
    "MetricsLine",
    "PooledEntry",
    "PrivacyBlock",
    "RunSummary",
    "SavedDownlinks",
    "Scores",
    "Traffic",
    "checkpoint_from_map",
    "compare_bytes",
    "known_version",
    "metrics_line_text",
    "metrics_record",
    "read_compare",
    "read_metrics_file",
    "read_summary",
    "summary_bytes",
]

SUMMARY_VERSION = 1
METRICS_VERSION = 1
CHECKPOINT_VERSION = 1
COMPARE_VERSION = 1

Share = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0, le=1.0)]
Gain = Annotated[float, Strict(), AllowInfNan(False), Field(ge=-1.0, le=1.0)]
# an MAE, kilobytes, bytes per client-round, seconds
Amount = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0, le=1e15)]
Count = Annotated[StrictInt, Field(ge=0)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]  # as client ids are
Number = StrictInt | Annotated[float, Strict()]  # as it was written: 3 stays 3, 3.0 stays 3.0


def known_version(source: object, data: Mapping[str, Any], known: int, what: str) -> None:
    """Refuse a document of a version this code does not read (no version: version 1);
    DataError naming ``source`` and the version."""
    found = data.get("version", 1)
    if found != known or isinstance(found, bool):
        raise DataError(
            source,
            f"is a {what} of version {one_line(repr(found), 40)}; this mqttfl reads version "
            f"{known} (a newer mqttfl wrote it?)",
        )


def _first_error(source: object, exc: ValidationError, what: str) -> DataError:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or what
    return DataError(source, one_line(f"{where}: {first['msg']}"))


D = TypeVar("D", bound=BaseModel)


def _validated(
    model: type[D], data: object, source: object, version: int, what: str, field_text: str
) -> D:
    """``data`` as ``model``: a map of a version this code reads, else DataError naming
    ``source`` and the first thing wrong."""
    if not isinstance(data, dict):
        raise DataError(source, f"holds a JSON {type(data).__name__}, not a {what}")
    known_version(source, data, version, what)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _first_error(source, exc, field_text) from None


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# --- summary.json --------------------------------------------------------------------------
class Means(_Document):
    accuracy: Share
    f1: Share
    mae: Amount


class ClientRow(Means):
    """A client's means over its last five reported rounds (``last_rounds``), its traffic
    and its part in the run (:class:`ClientPart`; older summaries lack them)."""

    kb_sent: Amount
    kb_received: Amount
    rounds_reported: Count | None = None
    last_rounds: list[Count] | None = None
    selected: Count | None = None
    uploaded: Count | None = None
    missed: Count | None = None
    left: list[Count] | None = None
    rejoined: list[Count] | None = None


class Traffic(_Document):
    up_bytes_per_client_round: Amount
    down_bytes_per_client_round: Amount
    up_bytes_total: Count | None = None
    down_bytes_total: Count | None = None


class Scores(_Document):
    """A Local reference client's (or their mean's) scores."""

    accuracy: Share
    f1: Share | None = None
    mae: Amount | None = None


class Gains(_Document):
    clients: dict[Name, Gain] = {}
    mean: Gain | None = None


class LocalReferenceBlock(_Document):
    """``local_reference`` (:func:`mqttfl.evaluation.reference.with_reference`)."""

    what: str | None = None
    source: str = "trained"  # or "cached"
    cache: str | None = None  # the cache file (None: it could not be written)
    key: str | None = None
    seconds: Amount = 0.0
    clients: dict[Name, Scores] = {}
    mean: Scores | None = None
    gain: Gains = Gains()


class PrivacyBlock(_Document):
    """[privacy]'s section (mqttfl/privacy/accountant.py ``privacy_summary``)."""

    delta: Annotated[float, Field(gt=0.0, lt=1.0)]
    clip: Amount
    noise_multiplier: Amount
    budget: Amount | None = None
    sampling_rate: Share | None = None
    uploads: dict[Name, Count]
    epsilon: dict[Name, Amount]


class BufferedBlock(_Document):
    """``buffered`` of a ``federation.mode = "buffered"`` run (mqttfl/engine/buffered.py)."""

    versions: Count = 0
    buffer_size: Count | None = None
    max_staleness: Count | None = None
    staleness_weighting: str | None = None
    # aggregated uploads by their staleness τ (a JSON key, so a string)
    staleness: dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")], Count] = {}
    too_stale: Count = 0
    client_staleness: dict[Name, Count] = {}  # each client's newest upload's τ


class RunSummary(_Document):
    """What a reader of ``summary.json`` may rely on (:func:`mqttfl.engine.state.run_summary`
    writes it; older summaries lack ``version``, ``split``, ``ordinal_labels`` and
    ``config``)."""

    version: Literal[1] = 1
    run_id: str
    method: Name
    split: str | None = None  # which test windows (mqttfl/data/sessions.py)
    ordinal_labels: bool | None = None  # labels are counts (None: shards not readable)
    rounds_completed: Count
    ended_early: str | None = None  # why the run stopped before its last round
    clients: dict[Name, ClientRow]
    mean: Means
    comm: Traffic
    rejections: dict[str, Count] = {}
    rejected_messages: dict[str, Count] = {}
    retries: Count = 0
    missing_uploads: Count = 0
    config: dict[str, Any] | None = None  # RunConfig.recorded()
    local_reference: LocalReferenceBlock | None = None
    privacy: PrivacyBlock | None = None  # with [privacy] on
    buffered: BufferedBlock | None = None  # federation.mode = "buffered"

    @property
    def data_split(self) -> str:
        """The split its numbers come from (older summaries: their config's, else window)."""
        if self.split is not None:
            return self.split
        data = (self.config or {}).get("data")
        found = data.get("split") if isinstance(data, dict) else None
        return found if isinstance(found, str) else "window"

    @property
    def shows_mae(self) -> bool:
        """An MAE means something only for counts (None: not known, not shown);
        summaries from before ``ordinal_labels`` keep theirs."""
        return self.ordinal_labels is True or "ordinal_labels" not in self.model_fields_set


def summary_from_map(data: object, source: object) -> RunSummary:
    """A decoded summary.json checked; DataError naming ``source`` and what is wrong."""
    return _validated(RunSummary, data, source, SUMMARY_VERSION, "run summary", "the summary")


def read_summary(path: Path) -> RunSummary:
    """A run's summary.json; DataError naming the file and the first thing wrong with it."""
    return summary_from_map(read_json(path), path)


def summary_bytes(summary: RunSummary) -> bytes:
    """summary.json's bytes: the keys it was read or built with (and ``version``), sorted."""
    data = {**summary.model_dump(exclude_unset=True), "version": summary.version}
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


# --- metrics.jsonl -------------------------------------------------------------------------
class MetricsLine(_Document):
    """One client's scores after applying round ``round``'s downlinks, as the coordinator
    journals them; further named numbers the client reported are kept as extras."""

    version: Literal[1] = 1
    round: Annotated[StrictInt, Field(ge=1, le=MAX_ROUND)]
    client_id: Name
    accuracy: Number
    f1: Number
    mae: Number
    num_test: Number | None = None
    bytes_up: Number = 0
    bytes_down: Number = 0

    def value(self, key: str) -> float | None:
        """A metric by name (a field or an extra), or None if the line has none."""
        found = getattr(self, key, None) if key in type(self).model_fields else None
        if found is None and self.model_extra:
            found = self.model_extra.get(key)
        return float(found) if isinstance(found, int | float) else None

    @classmethod
    def of(cls, metrics: Metrics) -> MetricsLine:
        """The line the coordinator journals for a checked :class:`Metrics` message."""
        return cls.model_validate(
            {
                **metrics.values,
                "round": metrics.round,
                "client_id": metrics.client_id,
                "version": METRICS_VERSION,
            }
        )


def metrics_line_text(line: MetricsLine) -> str:
    return json.dumps(line.model_dump(exclude_unset=True), sort_keys=True)


def metrics_record(value: Any) -> MetricsLine:
    """One metrics line checked as the coordinator checked the message it came from
    (:class:`~mqttfl.wire.control.Metrics`); WireError saying what is wrong."""
    if not isinstance(value, dict):
        raise WireError("type", f"a {type(value).__name__}, not a metrics record")
    values = {k: v for k, v in value.items() if k not in ("round", "client_id", "version")}
    if not isinstance(value.get("client_id"), str):
        raise WireError("type", "'client_id' is missing or not a string")
    Metrics(round_number(value.get("round"), low=1), value["client_id"], values)
    try:
        return MetricsLine.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the line"
        raise WireError("type", f"{where}: {first['msg']}") from None


def read_metrics_file(path: Path) -> tuple[list[MetricsLine], JsonLines]:
    """The lines of a metrics.jsonl up to its last complete line (a line cut short by a
    killed coordinator is left out) and the file as read; DataError naming the file and
    line of a record that is malformed or of a version this code does not read."""
    read = read_json_lines(path)
    records = []
    for number, value in read.lines:
        if isinstance(value, dict):
            known_version(f"{path}: line {number}", value, METRICS_VERSION, "metrics line")
        try:
            records.append(metrics_record(value))
        except WireError as exc:
            raise DataError(path, f"line {number}: {one_line(exc.detail)}") from None
    return records, read


# --- checkpoint.msgpack --------------------------------------------------------------------
class SavedDownlinks(_Document):
    """The last round's downlinks, encoded once: re-sent as they are after a crash."""

    broadcast: StrictBytes
    personal: dict[str, StrictBytes]


class ClientPart(_Document):
    """Rounds selected, uploaded, missed; when it left and came back (engine/parts.py)."""

    selected: Count = 0
    uploaded: Count = 0
    missed: Count = 0
    left: list[Count] = []  # rounds it left in
    rejoined: list[Count] = []


class Checkpoint(_Document):
    """The run state after the last closed round (:class:`mqttfl.engine.state.RunState`)."""

    version: Literal[1] = 1
    run_id: str
    method: str
    round: Annotated[StrictInt, Field(ge=0, le=MAX_ROUND)]
    server: dict[str, object]  # the method's server state
    comm: dict[str, Annotated[StrictInt, Field(ge=0, le=2**62)]]
    retries: Annotated[StrictInt, Field(ge=0, le=2**62)]
    missing_uploads: Annotated[StrictInt, Field(ge=0, le=2**62)]
    rejections: dict[str, Annotated[StrictInt, Field(ge=0, le=2**62)]]
    rejected_messages: dict[str, Annotated[StrictInt, Field(ge=0, le=2**62)]] = {}
    downlink_payloads: SavedDownlinks | None = None
    clients: list[str] = []
    uploads: dict[str, Annotated[StrictInt, Field(ge=0, le=2**62)]] = {}
    last_uploaders: list[Name] = []  # whose uploads round `round` took
    buffered: dict[str, object] = {}  # buffered mode: the buffer, sets and versions
    instance: Annotated[str, Field(pattern="^[0-9a-f]{0,32}$")] = ""  # "": a new one on resume
    parts: dict[Name, ClientPart] = {}

    def to_map(self) -> dict[str, object]:
        """The map checkpoint.msgpack holds (``buffered`` only when there is one)."""
        saved = self.downlink_payloads
        return {
            "version": self.version,
            "run_id": self.run_id,
            "method": self.method,
            "round": self.round,
            "server": self.server,
            "comm": self.comm,
            "retries": self.retries,
            "missing_uploads": self.missing_uploads,
            "rejections": self.rejections,
            "rejected_messages": self.rejected_messages,
            "downlink_payloads": None
            if saved is None
            else {"broadcast": saved.broadcast, "personal": saved.personal},
            "clients": self.clients,
            "uploads": self.uploads,
            **({"last_uploaders": self.last_uploaders} if self.last_uploaders else {}),
            **({"buffered": self.buffered} if self.buffered else {}),
            **({"instance": self.instance} if self.instance else {}),
            **({"parts": {c: p.model_dump() for c, p in self.parts.items()}} if self.parts else {}),
        }


#: what a field of a checkpoint that does not validate is not
_CHECKPOINT_FIELDS = {
    "server": "is not a map of names",
    "comm": "is not a map of counts",
    "rejections": "is not a map of counts",
    "rejected_messages": "is not a map of counts",
    "uploads": "is not a map of counts",
    "retries": "is not a count",
    "missing_uploads": "is not a count",
    "downlink_payloads": "are not the encoded downlinks",
    "buffered": "is not a map",
    "clients": "is not a list of client ids",
    "last_uploaders": "is not a list of client ids",
}


def checkpoint_from_map(data: object, source: object, *, run_id: str, method: str) -> Checkpoint:
    """A decoded checkpoint of run ``run_id`` and ``method``: StateError if it is another
    run's, DataError naming ``source`` and the field if it is malformed or of a version
    this code does not read."""
    if not isinstance(data, dict):
        raise DataError(source, f"holds a {type(data).__name__}, not a checkpoint's map")
    if data.get("run_id") != run_id or data.get("method") != method:
        raise StateError(
            f"{source}: belongs to run {str(data.get('run_id'))[:80]!r} "
            f"({str(data.get('method'))[:80]}); use another --out"
        )
    known_version(source, data, CHECKPOINT_VERSION, "checkpoint")
    if not data.get("downlink_payloads"):  # nothing saved (None, or an empty map)
        data = {**data, "downlink_payloads": None}
    try:
        return Checkpoint.model_validate(data)
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0])
        problem = (
            f"'round' is {repr(data.get('round'))[:40]}, not a round number"
            if field == "round"
            else f"'{field}' {_CHECKPOINT_FIELDS.get(field, 'is malformed')}"
        )
        raise DataError(source, f"not a checkpoint of this version: {problem}") from None


# --- compare.json --------------------------------------------------------------------------
class MeanStd(_Document):
    mean: float
    std: float


class CompareRow(_Document):
    """One row of `mqttfl compare`'s table: a method (or the pooled reference) in a
    setting, its metrics as mean ± std over the seeds that ran (none if no seed did)."""

    method: str
    setting: str
    runs: Count
    model: str | None = None  # the model a pinned entry runs
    seeds: list[int] = []
    failed_seeds: list[int] = []
    absent: str | None = None  # why it cannot run on this data
    accuracy: MeanStd | None = None
    f1: MeanStd | None = None
    mae: MeanStd | None = None
    kb: MeanStd | None = None

    def metric(self, key: str) -> MeanStd | None:
        found = getattr(self, key, None) if key in ("accuracy", "f1", "mae", "kb") else None
        return found if isinstance(found, MeanStd) else None


class CompareRun(_Document):
    """One (setting, method, seed) run of a compare, and its result."""

    setting: str
    method: str
    seed: int
    out: str  # its run directory
    metrics: dict[str, float] = {}  # accuracy, f1, mae, kb (none if it failed or is absent)
    curve: dict[str, float] = {}  # round -> mean client accuracy
    error: str | None = None
    absent: str | None = None


class PooledEntry(_Document):
    """One (setting, seed) pooled reference of a compare (:mod:`mqttfl.evaluation.pooled`)."""

    setting: str
    seed: int
    out: str
    metrics: dict[str, float] = {}
    per_client: dict[str, dict[str, float]] = {}
    absent: str | None = None


class CompareDocument(_Document):
    """compare.json (:mod:`mqttfl.evaluation.compare`)."""

    version: Literal[1] = 1
    config: str
    overrides: list[str]
    seeds: list[int]
    split: str
    ordinal_labels: bool
    settings: dict[str, dict[str, Any]]
    required_model: dict[str, str]
    rows: list[CompareRow]
    pooled: list[CompareRow] | None
    pooled_runs: list[PooledEntry]
    runs: list[CompareRun]


def compare_bytes(document: CompareDocument) -> bytes:
    data = {**document.model_dump(exclude_unset=True), "version": document.version}
    return (json.dumps(data, indent=2) + "\n").encode()


def read_compare(path: Path) -> CompareDocument:
    """A compare.json; DataError naming it and the first thing wrong."""
    what = "compare result"
    return _validated(CompareDocument, read_json(path), path, COMPARE_VERSION, what, f"the {what}")
