"""Bare torch training one client's model on its shard: the floor a torch client stands on.

    python -m benchmarks.bare_torch SHARD.npz ARCH NUM_CLASSES EMBED_DIM LR MOMENTUM \
        WEIGHT_DECAY BATCH EPOCHS ROUNDS

What a careful user would write without mqttfl: load the arrays, build the same model,
SGD with the same recipe and batch size, evaluate the test split in batches of that
size under ``no_grad``. It prints one JSON line: peak RSS (VmHWM), private memory at the end, the
MB the model's package import added (mqttfl.models imports pydantic via mqttfl.config;
subtracted from the figure, so the floor is torch's alone), and seconds per round.
"""

from __future__ import annotations

import json
import sys
import time


def _status() -> dict[str, float]:
    found: dict[str, float] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found


def _private_mb() -> float:
    total = 0
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean", "Private_Dirty")):
                total += int(line.split()[1])
    return total / 1024


def main(argv: list[str]) -> None:
    path, arch = argv[0], argv[1]
    classes, embed = int(argv[2]), int(argv[3])
    lr, momentum, decay = float(argv[4]), float(argv[5]), float(argv[6])
    batch, epochs, rounds = int(argv[7]), int(argv[8]), int(argv[9])
    import numpy as np
    import torch

    torch.set_num_threads(1)
    before = _status()["VmRSS"]
    from mqttfl.models import build_model

    package_mb = _status()["VmRSS"] - before
    arrays = np.load(path)
    x, y = arrays["x_train"], arrays["y_train"].astype(np.int64)
    x_test = arrays["x_test"]
    torch.manual_seed(0)
    model = build_model(
        arch, num_classes=classes, embed_dim=embed, input_dim=x.shape[1] if x.ndim == 2 else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=decay)
    rng = np.random.default_rng(0)
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        model.train()
        for _ in range(epochs):
            order = rng.permutation(len(x))
            for start in range(0, len(x), batch):
                index = order[start : start + batch]
                if len(index) < 2:
                    continue
                logits, _ = model(torch.from_numpy(x[index]))
                loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[index]))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
                optimizer.step()
        model.eval()
        with torch.no_grad():
            for start in range(0, len(x_test), batch):
                model(torch.from_numpy(x_test[start : start + batch]))
        seconds.append(time.perf_counter() - began)
    status = _status()
    result = {
        "peak_rss_mb": round(status["VmHWM"] - package_mb, 1),
        "private_mb_at_end": round(_private_mb() - package_mb, 1),
        "package_import_mb": round(package_mb, 1),
        "seconds_per_round": sorted(seconds)[len(seconds) // 2],
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
