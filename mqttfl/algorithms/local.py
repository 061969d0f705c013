"""Local: every client trains alone on its shard; nothing but an empty upload is sent.

The FedAPA paper's lower baseline (Table III, first row).
"""

from __future__ import annotations

from collections.abc import Mapping

from mqttfl.algorithms.base import (
    Algorithm,
    ClientSide,
    Context,
    Downlinks,
    ServerSide,
    Upload,
)
from mqttfl.wire.schemas import EMPTY, Body, ClientInfo, PayloadSchema


class LocalServer(ServerSide):
    def aggregate(
        self, t: int, uploads: list[Upload], staleness: Mapping[str, float] | None = None
    ) -> Downlinks:
        return Downlinks()


class LocalClient(ClientSide):
    @classmethod
    def upload_schema(cls, ctx: Context, info: ClientInfo) -> PayloadSchema:
        return EMPTY

    def make_upload(self, t: int) -> Body:
        return {}


ALGORITHMS = (Algorithm("local", LocalServer, LocalClient, summary="local training only"),)
