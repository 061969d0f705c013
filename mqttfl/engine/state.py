"""The coordinator's run state: counters, traffic accounting and the checkpoint, in one place."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mqttfl.config import RunConfig
from mqttfl.errors import MqttflError
from mqttfl.wire.control import DownlinkPayloads
from mqttfl.wire.ids import client_order

__all__ = ["RunState", "client_order"]


def _comm() -> dict[str, int]:
    return {"up_bytes": 0, "up_count": 0, "down_bytes": 0, "down_count": 0}


@dataclass
class RunState:
    """Everything a restarted coordinator needs to go on after round ``round``."""

    round: int = 0  # the last closed round
    server: dict[str, Any] = field(default_factory=dict)  # the method's server state
    comm: dict[str, int] = field(default_factory=_comm)  # payload bytes and counts
    retries: int = 0
    missing_uploads: int = 0
    rejections: Counter[str] = field(default_factory=Counter)  # uploads, by reason
    rejected_messages: Counter[str] = field(default_factory=Counter)  # everything else
    # The last round's downlinks, encoded once: re-sent as they are after a crash.
    downlinks: DownlinkPayloads | None = None
    clients: list[str] = field(default_factory=list)  # registered at the last close

    def to_dict(self, config: RunConfig) -> dict[str, Any]:
        return {
            "run_id": config.run_id,
            "method": config.method,
            "round": self.round,
            "server": self.server,
            "comm": dict(self.comm),
            "retries": self.retries,
            "missing_uploads": self.missing_uploads,
            "rejections": dict(self.rejections),
            "rejected_messages": dict(self.rejected_messages),
            "downlink_payloads": None
            if self.downlinks is None
            else {"broadcast": self.downlinks.broadcast, "personal": self.downlinks.personal},
            "clients": sorted(self.clients, key=client_order),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: RunConfig, *, source: str) -> RunState:
        """Raise MqttflError if the checkpoint belongs to another run or method."""
        if data.get("run_id") != config.run_id or data.get("method") != config.method:
            raise MqttflError(
                f"{source} belongs to run {data.get('run_id')!r} ({data.get('method')}); "
                "use another --out"
            )
        saved = data.get("downlink_payloads")
        return cls(
            round=int(data["round"]),
            server=data["server"],
            comm={**_comm(), **data["comm"]},
            retries=int(data["retries"]),
            missing_uploads=int(data["missing_uploads"]),
            rejections=Counter(data["rejections"]),
            rejected_messages=Counter(data.get("rejected_messages", {})),
            downlinks=DownlinkPayloads(saved["broadcast"], dict(saved["personal"]))
            if saved
            else None,
            clients=[str(c) for c in data.get("clients", [])],
        )


def run_summary(
    config: RunConfig, state: RunState, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """summary.json: per-client metrics (last five rounds), traffic and every counter."""
    from mqttfl.data.sources import labels_are_ordinal
    from mqttfl.engine.journal import mean_over_clients, summarize_clients

    table = summarize_clients(records)
    comm = state.comm
    up_n, down_n = max(comm["up_count"], 1), max(comm["down_count"], 1)
    return {
        "run_id": config.run_id,
        "method": config.method,
        # which test windows produced these numbers (mqttfl/data/sessions.py)
        "split": config.data.split,
        # whether labels are counts: an MAE is shown only then (None: shards not readable here)
        "ordinal_labels": labels_are_ordinal(config.data),
        "rounds_completed": state.round,
        "clients": table,
        "mean": mean_over_clients(table),
        "comm": {
            "up_bytes_per_client_round": comm["up_bytes"] / up_n,
            "down_bytes_per_client_round": comm["down_bytes"] / down_n,
            "up_bytes_total": comm["up_bytes"],
            "down_bytes_total": comm["down_bytes"],
        },
        "rejections": dict(state.rejections),
        "rejected_messages": dict(state.rejected_messages),
        "retries": state.retries,
        "missing_uploads": state.missing_uploads,
        "config": config.recorded(),
    }
