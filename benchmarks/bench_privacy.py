"""What an upload leaks, measured by attacking it, with and without differential privacy.

Each setting (DP off, and ``[privacy] epsilon`` ∈ {8, 3, 1} at δ=1e-5, clip 1,
the noise solved for the run's rounds) runs the same small federations in process (each
method's own client and server sides, no broker: :func:`run_federation`), scores every
client on its test split, and then attacks each client from its uploads alone, as the
coordinator or any peer on the broker sees them:

- **occupancy histogram from counts** (:func:`histogram_attack`): the room's label
  histogram (how many windows at each head count) from the per-class counts FedProto's
  sample-weighted bank uploads (exact without DP), averaged over the rounds, or from the
  set of classes a FedAPA upload names. Error: total variation distance to the true
  histogram (0 = recovered exactly); the prior (uniform over classes) is the floor to beat.
- **session membership** (:func:`membership_attack`): given one recording session the
  client trained on and one it did not (its test session), which did it train on? The
  attacker embeds both with an encoder and picks the session whose class means are closer
  (cosine) to the uploaded prototypes. Two attackers: a peer (its own FedAPA encoder,
  aligned to the shared prototypes: what a broker peer holds) and the white-box bound (the
  victim's own encoder, which never leaves the device). Chance: 50 %.
- **identification / nearest-neighbour reconstruction** (:func:`identification_attack`):
  which of the N rooms' recordings produced a set of prototypes (chance 1/N), and whether
  the window nearest each prototype in a pool of every room's windows is one of the
  victim's (a reconstruction by nearest neighbour; chance: the victim's share of the pool).

Accuracy and the attacks run on the ESPectre recordings (configs/presence-espectre.toml,
5 ESP32 chips, presence) and on the default job made small (configs/fedapa-csi.toml:
MiddleConvNet4, d=64, 200 windows per room, one 242-subcarrier grid), both under the
session split, ``ROUNDS`` rounds, FedAPA; FedAvg (DP-FedAvg when on) beside it for what
DP costs a weight method. Overhead: the seconds of ``make_upload`` and the encoded upload
bytes, with and without DP.

    nice -n 10 python -m benchmarks.bench_privacy [--quick]

``BENCH_PRIVACY_PARTS=overhead`` measures only the mechanisms' cost per upload (numpy,
seconds) and keeps the federations' entries of an existing privacy.json.

Writes benchmarks/results/privacy.json and docs/figures/privacy.png.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.common import REPO, RESULTS, bench_main, log

if TYPE_CHECKING:
    from mqttfl.algorithms.base import ClientSide
    from mqttfl.config import RunConfig
    from mqttfl.data.shard import Shard

ROUNDS = 6
SEED = 0
CLIP = 1.0
DELTA = 1e-5
#: setting name -> target ε (None: DP off)
SETTINGS: dict[str, float | None] = {"off": None, "eps8": 8.0, "eps3": 3.0, "eps1": 1.0}
BOOTSTRAPS = 20
FIGURE = REPO / "docs" / "figures" / "privacy.png"

JOBS: dict[str, tuple[str, list[str]]] = {
    "espectre": ("configs/presence-espectre.toml", ["method.warmup_rounds=3"]),
    "rooms": (
        "configs/fedapa-csi.toml",
        [
            "method.warmup_rounds=3",
            "model.name=middle",
            "model.embed_dim=64",
            "data.samples_per_client=200",
            "data.window=32",
            "data.device=nexmon-vht80",
        ],
    ),
}
#: per job, the methods whose accuracy is measured in every setting (attacks: FedAPA)
METHODS = {"espectre": ("fedapa", "fedavg"), "rooms": ("fedapa", "fedavg")}


def load(job: str, setting: str, rounds: int) -> tuple[RunConfig, dict[str, Shard]]:
    from mqttfl.config import load_config
    from mqttfl.evaluation.pooled import client_shards

    path, overrides = JOBS[job]
    epsilon = SETTINGS[setting]
    dp = (
        []
        if epsilon is None
        else [
            "privacy.enabled=true",
            f"privacy.clip={CLIP}",
            f"privacy.epsilon={epsilon}",
            f"privacy.delta={DELTA}",
        ]
    )
    config = load_config(
        path, [*overrides, f"rounds={rounds}", f"seed={SEED}", "data.split=session", *dp]
    )
    return config, client_shards(config)


@dataclass
class Federation:
    accuracy: dict[str, float]
    uploads: dict[str, list[dict[str, Any]]]  # per client, its upload of every round
    sides: dict[str, ClientSide]
    upload_s: float  # mean seconds of make_upload
    up_bytes: float  # mean encoded upload bytes


def run_federation(config: RunConfig, shards: dict[str, Shard], method: str) -> Federation:
    """``config.rounds`` full-participation rounds of ``method`` in this process."""
    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.algorithms.base import Upload
    from mqttfl.nodes.device import build_client_side, round_rng
    from mqttfl.wire import Message, encode

    config = config.model_copy(update={"method": method})
    algorithm = get_algorithm(method)
    ctx = make_context(config)
    server = algorithm.server(ctx)
    sides = {c: build_client_side(config, algorithm, ctx, c, s) for c, s in shards.items()}
    uploads: dict[str, list[dict[str, Any]]] = {c: [] for c in sides}
    seconds: list[float] = []
    sizes: list[int] = []
    for t in range(1, config.rounds + 1):
        params = server.round_params(t)
        round_uploads = []
        for cid, side in sides.items():
            side.train(t, dict(params), round_rng(config.seed, side.info, t))
            began = time.perf_counter()
            body = dict(side.make_upload(t))
            seconds.append(time.perf_counter() - began)
            sizes.append(len(encode(Message("upload", "bench", t, cid, body))))
            uploads[cid].append(body)
            round_uploads.append(Upload(cid, side.info, body))
        downlinks = server.aggregate(t, round_uploads)
        for cid, side in sides.items():
            side.receive(t, downlinks.broadcast, downlinks.personal.get(cid))
    accuracy = {
        cid: float(np.mean(side.predict(shards[cid].x_test) == shards[cid].y_test))
        for cid, side in sides.items()
    }
    return Federation(accuracy, uploads, sides, float(np.mean(seconds)), float(np.mean(sizes)))


# --- the attacks ---------------------------------------------------------------------------
def _unit(x: np.ndarray) -> np.ndarray:
    unit: np.ndarray = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return unit


def _class_means(z: np.ndarray, y: np.ndarray, classes: np.ndarray) -> dict[int, np.ndarray]:
    return {int(c): _unit(z[y == c]).mean(axis=0) for c in classes if np.any(y == c)}


def _match(prototypes: dict[int, np.ndarray], means: dict[int, np.ndarray]) -> float:
    """Mean cosine between an upload's prototypes and a candidate's class means."""
    common = sorted(set(prototypes) & set(means))
    if not common:
        return -np.inf
    return float(np.mean([_unit(prototypes[c]) @ _unit(means[c]) for c in common]))


def _prototypes(
    body: dict[str, Any], null: np.random.Generator | None = None
) -> dict[int, np.ndarray]:
    """An upload's prototypes by class; with ``null``, random vectors in their place (the
    attack's null: what it scores on an upload that carries nothing)."""
    protos = {int(c): p for c, p in zip(body["classes"], body["prototypes"], strict=True)}
    if null is not None:
        protos = {c: null.normal(size=p.shape) for c, p in protos.items()}
    return protos


def _embed(side: ClientSide, x: np.ndarray) -> np.ndarray:
    from mqttfl.training.loops import embed_all

    return embed_all(side.model, x)


def membership_attack(
    fed: Federation,
    shards: dict[str, Shard],
    attacker: str,
    rng: np.random.Generator,
    *,
    null: bool = False,
) -> float | None:
    """Success rate (%) of telling a trained-on session from the client's test session.

    ``attacker``: "victim" (its own encoder, the white-box bound) or "peer" (the next
    client's encoder)."""
    ids = sorted(fed.sides, key=int)
    wins: list[bool] = []
    for index, cid in enumerate(ids):
        shard = shards[cid]
        if shard.s_train is None or not len(shard.y_test):
            continue
        encoder = fed.sides[cid if attacker == "victim" else ids[(index + 1) % len(ids)]]
        protos = _prototypes(fed.uploads[cid][-1], rng if null else None)
        z_train, z_test = _embed(encoder, shard.x_train), _embed(encoder, shard.x_test)
        sessions = np.unique(shard.s_train)
        for _ in range(BOOTSTRAPS):
            chosen = shard.s_train == rng.choice(sessions)
            member = rng.permutation(np.flatnonzero(chosen))[: max(1, int(chosen.sum()) // 2)]
            other = rng.permutation(len(shard.y_test))[: max(1, len(shard.y_test) // 2)]
            classes = np.intersect1d(shard.y_train[member], shard.y_test[other])
            if not len(classes):
                continue
            inside = _match(protos, _class_means(z_train[member], shard.y_train[member], classes))
            outside = _match(protos, _class_means(z_test[other], shard.y_test[other], classes))
            wins.append(inside > outside if inside != outside else bool(rng.integers(2)))
    return 100.0 * float(np.mean(wins)) if wins else None


def identification_attack(
    fed: Federation, shards: dict[str, Shard], attacker: str, null: np.random.Generator | None
) -> dict[str, float]:
    """Which room's recording produced the prototypes (top-1 %, chance 100/N), and the
    share of prototypes whose nearest pool window is the victim's (%, beside chance)."""
    ids = sorted(fed.sides, key=int)
    found, hits, chance = [], [], []
    for index, cid in enumerate(ids):
        encoder = fed.sides[cid if attacker == "victim" else ids[(index + 1) % len(ids)]]
        protos = _prototypes(fed.uploads[cid][-1], null)
        pool = {u: _embed(encoder, shards[u].x_train) for u in ids}
        scores = {
            u: _match(protos, _class_means(pool[u], shards[u].y_train, np.array(list(protos))))
            for u in ids
        }
        found.append(max(scores, key=lambda u: scores[u]) == cid)
        for c, p in protos.items():
            owners = np.concatenate([np.full(int(np.sum(shards[u].y_train == c)), u) for u in ids])
            windows = np.concatenate([pool[u][shards[u].y_train == c] for u in ids])
            if not len(windows):
                continue
            nearest = int(np.argmax(_unit(windows) @ _unit(p)))
            hits.append(owners[nearest] == cid)
            chance.append(float(np.mean(owners == cid)))
    return {
        "identified": 100.0 * float(np.mean(found)),
        "identified_chance": 100.0 / len(ids),
        "nearest_window_hit": 100.0 * float(np.mean(hits)) if hits else float("nan"),
        "nearest_window_chance": 100.0 * float(np.mean(chance)) if chance else float("nan"),
    }


def histogram_attack(
    shards: dict[str, Shard], num_classes: int, rounds: int, epsilon: float | None
) -> dict[str, float]:
    """Total variation distance (%) between each client's label histogram and the
    attacker's estimate, mean over clients: from counts (FedProto, sample-weighted) averaged
    over the rounds' uploads, and from the class sets alone (FedAPA); the prior (uniform
    over classes) beside them. The count release does not depend on the model, so the
    mechanism is run here on the real labels, exactly as a client runs it."""
    from mqttfl.privacy.accountant import solve_noise
    from mqttfl.privacy.mechanism import DEFAULT_COUNT_THRESHOLD, private_class_prototypes

    rng = np.random.default_rng(SEED)
    z = None if epsilon is None else solve_noise(epsilon, rounds, DELTA)
    tv: dict[str, list[float]] = {"counts": [], "class_set": [], "prior": []}
    for shard in shards.values():
        true = np.bincount(shard.y_train, minlength=num_classes).astype(float)
        true /= true.sum()
        if z is None:
            counts, present = true.copy(), true > 0
        else:
            total = np.zeros(num_classes)
            present = np.zeros(num_classes, bool)
            for _ in range(rounds):
                classes, _, released = private_class_prototypes(
                    np.ones((len(shard.y_train), 2)),
                    shard.y_train,
                    num_classes=num_classes,
                    clip=CLIP,
                    noise_multiplier=z,
                    rng=rng,
                    count_threshold=DEFAULT_COUNT_THRESHOLD,
                )
                total[classes] += released
                present[classes] = True
            counts = total / rounds
        estimates = {
            "counts": counts,
            "class_set": present.astype(float),
            "prior": np.ones(num_classes),
        }
        for key, estimate in estimates.items():
            estimate = np.clip(estimate, 0, None)
            estimate = estimate / estimate.sum() if estimate.sum() > 0 else np.ones(num_classes)
            tv[key].append(50.0 * float(np.abs(estimate / estimate.sum() - true).sum()))
    return {key: float(np.mean(values)) for key, values in tv.items()}


def overhead(repeats: int = 30) -> dict[str, Any]:
    """Median seconds per upload of each mechanism beside what it replaces, at the sizes
    of the default job (400·2/3 windows of d=256 over 21 classes; LargeConvNet4's 463,748
    weights) and of the accountant's check before each upload."""
    from mqttfl.privacy.accountant import epsilon_spent
    from mqttfl.privacy.mechanism import noise_rng, private_class_prototypes, private_update
    from mqttfl.training.loops import class_prototypes
    from mqttfl.wire import Message, encode

    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(267, 256)).astype(np.float32), rng.integers(0, 21, 267)
    weights = rng.normal(size=463_748).astype(np.float32)
    start = weights + rng.normal(scale=0.01, size=weights.shape).astype(np.float32)
    noise = noise_rng()
    body = {"classes": np.arange(21), "prototypes": z[:21]}
    settings = {"dp_clip": CLIP, "dp_noise": 2.47, "dp_delta": DELTA}
    plain = len(encode(Message("upload", "bench", 1, "0", body)))
    declared = len(encode(Message("upload", "bench", 1, "0", {**body, **settings})))

    def median(work: Any) -> float:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            work()
            times.append(time.perf_counter() - began)
        return float(np.median(times))

    return {
        "prototypes_exact_s": median(lambda: class_prototypes(z, y)),
        "prototypes_private_s": median(
            lambda: private_class_prototypes(
                z, y, num_classes=21, clip=CLIP, noise_multiplier=2.47, rng=noise
            )
        ),
        "weights_private_s": median(
            lambda: private_update(weights, start, clip=CLIP, noise_multiplier=2.47, rng=noise)
        ),
        "accountant_check_s": median(lambda: epsilon_spent.__wrapped__(2.47, 15, DELTA)),
        "declaration_bytes": declared - plain,
    }


# --- the grid ------------------------------------------------------------------------------------
def run(quick: bool) -> dict[str, Any]:
    from mqttfl.privacy.accountant import privacy_settings

    if os.environ.get("BENCH_PRIVACY_PARTS") == "overhead":
        path = RESULTS / f"privacy{'-quick' if quick else ''}.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        kept = {
            k: v for k, v in kept.items() if k in ("rounds", "clip", "delta", "bootstraps", "jobs")
        }
        return {**kept, "overhead": overhead()}
    rounds = 2 if quick else ROUNDS
    settings = ["off", "eps1"] if quick else list(SETTINGS)
    out: dict[str, Any] = {
        "rounds": rounds,
        "clip": CLIP,
        "delta": DELTA,
        "bootstraps": BOOTSTRAPS,
        "jobs": {},
    }
    for job in JOBS:
        results: dict[str, Any] = {}
        for setting in settings:
            config, shards = load(job, setting, rounds)
            dp = privacy_settings(config)
            entry: dict[str, Any] = {
                "epsilon": SETTINGS[setting],
                "noise_multiplier": None if dp is None else dp.noise_multiplier,
                "histogram": histogram_attack(
                    shards, config.model.num_classes, rounds, SETTINGS[setting]
                ),
            }
            for method in METHODS[job]:
                began = time.perf_counter()
                fed = run_federation(config, shards, method)
                row: dict[str, Any] = {
                    "accuracy": 100.0 * float(np.mean(list(fed.accuracy.values()))),
                    "clients": fed.accuracy,
                    "upload_s": fed.upload_s,
                    "up_bytes": fed.up_bytes,
                    "seconds": time.perf_counter() - began,
                }
                if dp is not None:
                    row["epsilon_per_client"] = {c: dp.spent(rounds) for c in fed.accuracy}
                if method == "fedapa":
                    rng = np.random.default_rng(SEED)
                    row["attacks"] = {
                        attacker: {
                            "membership": membership_attack(fed, shards, attacker, rng),
                            "membership_null": membership_attack(
                                fed, shards, attacker, rng, null=True
                            ),
                            **identification_attack(fed, shards, attacker, None),
                            **{
                                f"{k}_null": v
                                for k, v in identification_attack(
                                    fed, shards, attacker, rng
                                ).items()
                                if not k.endswith("chance")
                            },
                        }
                        for attacker in ("victim", "peer")
                    }
                entry[method] = row
                log(
                    f"{job} {setting} {method}: accuracy {row['accuracy']:.1f} %, "
                    f"{row['seconds']:.0f} s, attacks {row.get('attacks')}"
                )
            results[setting] = entry
        out["jobs"][job] = results
    out["overhead"] = overhead()
    if not quick:
        plot(out)
    return out


def plot(out: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for job, results in out["jobs"].items():
        names = list(results)
        x = np.arange(len(names))
        labels = [
            "off" if results[n]["epsilon"] is None else f"ε={results[n]['epsilon']:g}"
            for n in names
        ]
        for method in METHODS[job]:
            axes[0].plot(
                x, [results[n][method]["accuracy"] for n in names], "o-", label=f"{job} {method}"
            )
        axes[1].plot(
            x,
            [results[n]["fedapa"]["attacks"]["victim"]["membership"] for n in names],
            "o-",
            label=f"{job} membership (victim encoder)",
        )
        axes[1].plot(
            x,
            [results[n]["fedapa"]["attacks"]["victim"]["identified"] for n in names],
            "s--",
            label=f"{job} room identified (victim encoder)",
        )
        axes[2].plot(
            x, [results[n]["histogram"]["counts"] for n in names], "o-", label=f"{job} from counts"
        )
        axes[2].plot(
            x,
            [results[n]["histogram"]["class_set"] for n in names],
            "s--",
            label=f"{job} from class set",
        )
        for ax in axes:
            ax.set_xticks(x, labels)
    axes[0].set_ylabel("mean client accuracy (%)")
    axes[0].set_title("accuracy (session split)")
    axes[1].set_ylabel("attack success (%)")
    axes[1].axhline(50, color="grey", lw=0.8, ls=":")
    axes[1].set_title("membership / identification")
    axes[2].set_ylabel("histogram error, TV (%)")
    axes[2].set_title("occupancy histogram recovery")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=120)
    plt.close(fig)


def main() -> None:
    bench_main("privacy", "what uploads leak, with and without differential privacy", run)


if __name__ == "__main__":
    main()
