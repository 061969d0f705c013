"""How far FedAPA's bounded L_c gradient is from exact Eq. 10, at N = 12, 100 and 1000.

Monte Carlo, no training: N clients' padded prototype sets (C=21 classes, d=64) come
from 4 clusters of clients (a cluster center per class, plus per-client noise); a batch
of 32 embeddings with labels stands for one local step of client 0. For each of R rounds
the server draws its downlink as it does in a run (:class:`FedAPAServer.aggregate`, round
t seeds the draw), client 0 forms its weighted L_c over [P_0, *S, *extra] and its
gradient with respect to the embeddings; the exact gradient is Eq. 10's mean over all N
sets. Reported: the mean over rounds of ‖g_bounded - g_exact‖ / ‖g_exact‖, for the
uniform shared sample (``uniform``: the earlier design) and the stratified one (``strata``:
one set per cluster of similar sets, weighted by its cluster's size), with the bytes a
client receives at C=21, d=256.

Run: ``python -m benchmarks.bench_fedapa_deviation`` (writes
benchmarks/results/fedapa_deviation.json).
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import numpy as np
import torch

from benchmarks.common import RESULTS, machine
from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.common.prototype_uploads import uploaded_prototypes
from mqttfl.algorithms.fedapa import FedAPAParams, FedAPAServer, prototype_contrast
from mqttfl.algorithms.fedapa.downlinks import Broadcast
from mqttfl.algorithms.fedapa.peer_sampling import dequantize_sets
from mqttfl.wire.downlinks import encode_downlinks
from mqttfl.wire.schemas import ClientInfo

C, D, K, CLUSTERS, BATCH, TAU = 21, 64, 8, 4, 32, 0.5
ROUNDS = 40


def _uploads(n: int, *, seed: int, d: int = D) -> list[Upload]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CLUSTERS, C, d)).astype(np.float32)
    uploads = []
    for i in range(n):
        protos = centers[i % CLUSTERS] + 0.5 * rng.standard_normal((C, d)).astype(np.float32)
        info = ClientInfo(str(i), "tiny", tuple(range(C)), 10, (8, 6))
        body = {"classes": np.arange(C, dtype=np.int64), "prototypes": protos}
        uploads.append(Upload(str(i), info, body))
    return uploads


def _server(sampling: str, d: int = D) -> FedAPAServer:
    return FedAPAServer(Context(C, d, 100, 0, FedAPAParams(max_peer_sets=K, sampling=sampling)))


def _gradient(z: torch.Tensor, anchors: torch.Tensor, y: torch.Tensor, w: Any) -> torch.Tensor:
    z = z.clone().requires_grad_(True)
    available = torch.ones(C, dtype=torch.bool)
    loss = prototype_contrast(z, anchors, y, available, TAU, w)
    (grad,) = torch.autograd.grad(loss, z)
    return grad


def deviation(n: int, sampling: str) -> dict[str, float]:
    uploads = _uploads(n, seed=n)
    gen = torch.Generator().manual_seed(n)
    z = torch.randn(BATCH, D, generator=gen)
    y = torch.randint(0, C, (BATCH,), generator=gen)
    server = _server(sampling)
    padded = torch.from_numpy(np.stack([uploaded_prototypes(u)["prototypes"] for u in uploads]))
    exact = _gradient(z, padded, y, None)
    ratios = []
    for t in range(1, ROUNDS + 1):
        down = server.aggregate(t, uploads)
        broadcast = cast("Broadcast", down.broadcast)
        if "prototypes_int8" in broadcast:
            sets = torch.from_numpy(
                dequantize_sets(broadcast["prototypes_int8"], broadcast["prototypes_scale"])
            )
        else:
            sets = torch.from_numpy(down.broadcast["prototypes"])
        mine = down.personal["0"]
        own = padded[0].numpy()  # every class held: client 0's rebuilt P_i is its upload
        anchors = [torch.from_numpy(own)[None], sets]
        if "extra" in mine:
            anchors.append(torch.from_numpy(mine["extra"]))
        weights = torch.from_numpy(mine["set_weights"])
        g = _gradient(z, torch.cat(anchors), y, weights)
        ratios.append(float((g - exact).norm() / exact.norm()))
    return {"mean": float(np.mean(ratios)), "p90": float(np.quantile(ratios, 0.9))}


def downlink_bytes(n: int, sampling: str) -> int:
    """The most one client receives in a round at C=21, d=256 (broadcast + personal)."""
    down = _server(sampling, 256).aggregate(1, _uploads(n, seed=n, d=256))
    payloads = encode_downlinks("r", 1, down.broadcast, down.personal)
    return len(payloads.broadcast) + max(len(p) for p in payloads.personal.values())


def run(quick: bool) -> dict[str, Any]:
    """Every row of the study (one size only: ``quick`` changes nothing)."""
    began = time.monotonic()
    rows = []
    for sampling in ("uniform", "strata"):
        for n in (12, 100, 1000):
            row = {"sampling": sampling, "n": n, **deviation(n, sampling)}
            row["downlink_bytes_d256"] = downlink_bytes(n, sampling)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {
        "what": "L_c gradient deviation from exact Eq. 10 (‖g-g*‖/‖g*‖, mean over rounds)",
        "setup": {"C": C, "d": D, "k": K, "clusters": CLUSTERS, "batch": BATCH, "rounds": ROUNDS},
        "rows": rows,
        "seconds": round(time.monotonic() - began, 1),
        "machine": machine(),
    }
    return out


def main() -> None:
    out = run(quick=False)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fedapa_deviation.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
