"""The coordinator's upload gate: every upload is accepted once or rejected with a reason.

Checks run cheapest first. :meth:`UploadGate.screen` needs only the topic and the size,
and is O(1): size, round in the topic (stale/future), a repeat of an accepted upload.
Only then is the upload decoded: the envelope (type, run, round, sender against the
topic's client id), the client's registration and selection, the method's payload
schema.

Upload schemas are cached by what decides them (architecture and sample shape), at most
:data:`MAX_SCHEMAS` of them: an announcement's ``arch`` is chosen by its sender, and a
cache keyed by it without a bound would grow by about 1 KB per announcement.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from mqttfl.algorithms.base import Algorithm, Context, Upload
from mqttfl.errors import RejectedUpload, WireError
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.sizes import shape_problem
from mqttfl.wire import PayloadSchema
from mqttfl.wire.control import read_envelope
from mqttfl.wire.schemas import ClientInfo

MAX_SCHEMAS = 64
SchemaKey = tuple[str, tuple[int, ...]]


@dataclass
class UploadGate:
    algorithm: Algorithm
    ctx: Context
    run_id: str
    max_bytes: int
    rejections: Counter[str] = field(default_factory=Counter)  # shared with the run state
    # uploads counted per identity (the run state's, for [privacy]'s budget)
    counted: Counter[str] = field(default_factory=Counter)
    round: int = 0
    open: bool = False
    selected: frozenset[str] = frozenset()
    accepted: dict[str, Upload] = field(default_factory=dict)
    accepted_bytes: dict[str, int] = field(default_factory=dict)
    _schemas: OrderedDict[SchemaKey, PayloadSchema] = field(default_factory=OrderedDict)

    def open_round(self, t: int, selected: list[str], *, keep: bool) -> None:
        """Open round t for ``selected``; ``keep`` (a retry of round t) retains the uploads
        of earlier attempts and still takes them from clients selected in those attempts."""
        earlier = self.selected if keep and t == self.round else frozenset()
        if not keep or t != self.round:
            self.accepted, self.accepted_bytes = {}, {}
        self.round, self.open, self.selected = (
            t,
            True,
            frozenset(selected) | set(self.accepted) | earlier,
        )

    @property
    def schemas_cached(self) -> int:
        """How many upload schemas the gate keeps (at most MAX_SCHEMAS, oldest evicted)."""
        return len(self._schemas)

    def close_round(self) -> list[Upload]:
        self.open = False
        return [self.accepted[c] for c in sorted(self.accepted)]

    def schema_for(self, info: ClientInfo) -> PayloadSchema:
        """The method's upload schema for this client; WireError if its announcement
        (an unknown model, an impossible sample shape) leaves the method nothing to accept."""
        key = (info.arch, info.sample_shape)
        problem = None
        if info.arch in MODEL_NAMES:  # (a method may take uploads of a model it never sees)
            problem = shape_problem(info.arch, info.sample_shape)
        if problem is not None:  # it would fail at every round start
            raise WireError("client_info", problem)
        schema = self._schemas.get(key)
        if schema is None:
            try:
                schema = self.algorithm.upload_schema(self.ctx, info)
            except Exception as exc:  # the method's own error about this announcement
                detail = f"no upload schema for {info.arch!r} {info.sample_shape}: {exc}"
                raise WireError("client_info", detail[:300]) from None
            self._schemas[key] = schema
            if len(self._schemas) > MAX_SCHEMAS:
                self._schemas.popitem(last=False)
        self._schemas.move_to_end(key)
        return schema

    def screen(self, t: int, client: str, size: int) -> None:
        """The O(1) checks, from the topic and the size alone: RejectedUpload (counted)
        for an upload the open round does not wait for, before anything is decoded."""
        try:
            self._screen(t, client, size)
        except WireError as exc:
            self.rejections[exc.reason] += 1
            raise RejectedUpload(exc.reason, exc.detail) from None

    def check(
        self, t: int, topic_client: str, raw: bytes, info: ClientInfo | None, wire_bytes: int = -1
    ) -> Upload:
        """Return the accepted Upload or raise RejectedUpload (and count it).
        ``wire_bytes``: what the upload took on the wire, chunk framing included."""
        try:
            upload = self._check(t, topic_client, raw, info)
        except WireError as exc:
            self.rejections[exc.reason] += 1
            raise RejectedUpload(exc.reason, exc.detail) from None
        self._take(t, upload, wire_bytes if wire_bytes >= 0 else len(raw))
        return upload

    def _take(self, t: int, upload: Upload, size: int) -> None:
        """Keep an accepted upload of round ``t`` (``size``: its bytes on the wire)."""
        self.accepted[upload.client_id] = upload
        self.accepted_bytes[upload.client_id] = size

    def was_selected(self, t: int, client: str) -> bool:
        return client in self.selected

    def _screen(self, t: int, client: str, size: int) -> None:
        if size > self.max_bytes:
            raise WireError("oversize", f"{size} bytes exceeds the limit of {self.max_bytes}")
        if t < self.round or (t == self.round and not self.open):
            raise WireError(
                "stale", f"upload for round {t} after it closed (now round {self.round})"
            )
        if t > self.round:
            raise WireError("future", f"upload for round {t} while round {self.round} is open")
        if client in self.accepted:
            raise WireError("duplicate", f"client {client!r} already uploaded for round {t}")

    def _check(self, t: int, client: str, raw: bytes, info: ClientInfo | None) -> Upload:
        self._screen(t, client, len(raw))
        message = read_envelope(raw, "upload", self.run_id, sender=client, round=t, max_bytes=None)
        if info is None:
            raise WireError("unknown_client", f"client {client!r} never announced itself")
        if not self.was_selected(t, client):
            raise WireError("not_selected", f"client {client!r} is not selected in round {t}")
        self.check_budget(client)
        self.schema_for(info).validate(message.body)
        return Upload(client, info, message.body)

    def over_budget(self, client: str) -> bool:
        """One more upload of ``client`` would take it past [privacy]'s ε (our count)."""
        privacy = self.ctx.privacy
        return privacy is not None and privacy.would_exceed(self.counted[client])

    def check_budget(self, client: str) -> None:
        """WireError ``over_budget`` when one more upload of ``client`` would take it past
        [privacy]'s ε, by the uploads this coordinator counted (a device that lost or reset
        its own count is held to this one)."""
        privacy = self.ctx.privacy
        if privacy is None or not self.over_budget(client):
            return
        spent = privacy.spent(self.counted[client])
        raise WireError(
            "over_budget",
            f"client {client!r} spent ε={spent:.4g} of {privacy.epsilon:g} in "
            f"{self.counted[client]} uploads",
        )
