"""The coordinator's upload gate: every upload is accepted once or rejected with a reason.

Checks run cheapest first: size (before decoding), round in the topic (stale/future),
then the decoded envelope (type, run, round, sender against the topic's client id), the
client's registration and selection, duplicates, and the method's payload schema.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mqttfl.algorithms.base import Algorithm, Context, Upload
from mqttfl.errors import RejectedUpload, WireError
from mqttfl.wire import PayloadSchema
from mqttfl.wire.control import read_envelope
from mqttfl.wire.schemas import ClientInfo


@dataclass
class UploadGate:
    algorithm: Algorithm
    ctx: Context
    run_id: str
    max_bytes: int
    rejections: Counter[str] = field(default_factory=Counter)  # shared with the run state
    round: int = 0
    open: bool = False
    selected: frozenset[str] = frozenset()
    accepted: dict[str, Upload] = field(default_factory=dict)
    accepted_bytes: dict[str, int] = field(default_factory=dict)
    _schemas: dict[tuple[str, str, tuple[int, ...]], PayloadSchema] = field(default_factory=dict)

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

    def close_round(self) -> list[Upload]:
        self.open = False
        return [self.accepted[c] for c in sorted(self.accepted)]

    def schema_for(self, info: ClientInfo) -> PayloadSchema:
        """The method's upload schema for this client; WireError if its announcement
        (an unknown model, an impossible sample shape) leaves the method nothing to accept."""
        key = (info.client_id, info.arch, info.sample_shape)
        if key not in self._schemas:
            try:
                self._schemas[key] = self.algorithm.upload_schema(self.ctx, info)
            except Exception as exc:  # the method's own error about this announcement
                detail = f"no upload schema for {info.arch!r} {info.sample_shape}: {exc}"
                raise WireError("client_info", detail[:300]) from None
        return self._schemas[key]

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
        self.accepted[topic_client] = upload
        self.accepted_bytes[topic_client] = wire_bytes if wire_bytes >= 0 else len(raw)
        return upload

    def _check(self, t: int, client: str, raw: bytes, info: ClientInfo | None) -> Upload:
        if len(raw) > self.max_bytes:
            raise WireError("oversize", f"{len(raw)} bytes exceeds the limit of {self.max_bytes}")
        if t < self.round or (t == self.round and not self.open):
            raise WireError(
                "stale", f"upload for round {t} after it closed (now round {self.round})"
            )
        if t > self.round:
            raise WireError("future", f"upload for round {t} while round {self.round} is open")
        message = read_envelope(raw, "upload", self.run_id, sender=client, round=t, max_bytes=None)
        if info is None:
            raise WireError("unknown_client", f"client {client!r} never announced itself")
        if client not in self.selected:
            raise WireError("not_selected", f"client {client!r} is not selected in round {t}")
        if client in self.accepted:
            raise WireError("duplicate", f"client {client!r} already uploaded for round {t}")
        self.schema_for(info).validate(message.body)
        return Upload(client, info, message.body)
