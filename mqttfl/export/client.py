"""Rebuild a client of a finished run and write its evaluation model as ONNX.

The model is found where it lives: in a run directory that ``mqttfl run`` (or a coordinator
with local clients) wrote, or on the device itself, in its ``--state-dir`` beside the copy
of the run's manifest its client kept (:mod:`mqttfl.nodes.manifest`); the config comes
from the run's summary or that manifest, never from the user again.

The client is built as its runner builds it (:func:`mqttfl.nodes.device.build_client_side`
on the shard its config gives it), its state file ``clients/client-<id>.pt`` is loaded
read-only (the run's files are never renamed or changed: a state that cannot be used is
one DataError, never an untrained export), and its method's
:meth:`~mqttfl.algorithms.base.ClientSide.evaluation_model` for the last round it
applied is traced to ONNX with a dynamic batch axis (:mod:`mqttfl.export.trace`). The
ONNX model is then run with onnxruntime on the client's test windows and compared with
torch: the largest absolute difference goes into ``sensor.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.engine.documents import RunSummary, read_metrics_file, read_summary
from mqttfl.errors import DataError, UsageError
from mqttfl.export.sensor import class_names, preprocess_from_shard
from mqttfl.export.trace import Exporter, trace_onnx
from mqttfl.sensing.spec import MODEL_FILE, SensorSpec
from mqttfl.wire.ids import check_id, client_order

OPSET = 18
INPUT_NAME, OUTPUT_NAME = "x", "scores"


@dataclass(frozen=True)
class Source:
    """Where one client's model lives, and the config it trained under."""

    config: Any  # RunConfig (torch-free import of this module: kept as Any)
    state_file: Path
    scores: dict[str, object]  # the run's last evaluation of the client ({}: evaluate here)
    origin: dict[str, str]  # recorded in sensor.json's run section


@dataclass(frozen=True)
class Exported:
    client_id: str
    directory: Path
    spec: SensorSpec
    max_abs_diff: float


def run_summary(run_dir: Path) -> RunSummary:
    """The run's summary.json as checked by :func:`mqttfl.engine.documents.read_summary`
    (DataError naming it and what is wrong), with the config it ran."""
    path = Path(run_dir) / "summary.json"
    if not Path(run_dir).is_dir():
        raise DataError(run_dir, "run directory not found")
    if not path.exists():
        raise DataError(path, "file not found: the run has not finished")
    summary = read_summary(path)
    if summary.config is None:
        raise DataError(path, "holds no 'config' (not written by mqttfl run or coordinator)")
    return summary


def run_clients(summary: RunSummary) -> list[str]:
    return sorted(summary.clients, key=client_order)


def last_scores(run_dir: Path, client_id: str) -> dict[str, object]:
    """The client's last evaluated round in metrics.jsonl (accuracy, F1, MAE), read up to
    its last complete line and never changed; DataError naming a malformed line."""
    records, _ = read_metrics_file(Path(run_dir) / "metrics.jsonl")
    mine = [r for r in records if r.client_id == client_id]
    if not mine:
        return {}
    best = max(mine, key=lambda r: r.round)
    keys = ("round", "accuracy", "f1", "mae", "num_test")
    return best.model_dump(include=set(keys), exclude_unset=True)


def export_onnx(module: Any, example: np.ndarray, path: Path) -> Exporter:
    """Trace the evaluation model (:func:`mqttfl.export.trace.trace_onnx`); returns the
    exporter that wrote the file."""
    import torch

    return trace_onnx(
        module,
        (torch.from_numpy(example),),
        path,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset=OPSET,
    )


def torch_scores(module: Any, x: np.ndarray, batch: int) -> np.ndarray:
    import torch

    with torch.no_grad():
        parts = [
            module(torch.from_numpy(x[i : i + batch])).numpy() for i in range(0, len(x), batch)
        ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def onnx_scores(path: Path, x: np.ndarray, batch: int) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    parts = [
        session.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + batch]})[0]
        for i in range(0, len(x), batch)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def in_run_dir(run_dir: Path, client_id: str) -> Source:
    """A client of a run directory (its summary's config, ``clients/`` its states)."""
    from mqttfl.config import RunConfig
    from mqttfl.nodes.client_state import state_path

    run_dir = Path(run_dir)
    client_id = check_id(client_id)
    summary = run_summary(run_dir)
    known = run_clients(summary)
    if known and client_id not in known:
        raise UsageError(f"--client {client_id}: run {run_dir} has clients {', '.join(known)}")
    try:
        config = RunConfig.model_validate(summary.config)
    except Exception as exc:
        raise DataError(run_dir / "summary.json", f"its config does not load: {exc}") from None
    # A client keeps one state file per run id; runs from before that kept one per client.
    state_file = state_path(run_dir / "clients", config.run_id, client_id)
    if not state_file.is_file() and (run_dir / "clients" / f"client-{client_id}.pt").is_file():
        state_file = run_dir / "clients" / f"client-{client_id}.pt"
    if not state_file.is_file():
        raise DataError(
            state_file,
            f"client state file not found: a device started on its own keeps its model on "
            f"the device; there run: mqttfl export --state-dir client-state --run "
            f"{config.run_id} --client {client_id} --out DIR",
        )
    origin = {"run_dir": str(run_dir.resolve())}
    return Source(config, state_file, last_scores(run_dir, client_id), origin)


def on_device(state_dir: Path, run_id: str, client_id: str) -> Source:
    """A client's model where it lives: ``state_dir/<run>/client-<id>.pt``, with the copy
    of the run's manifest its client kept beside it."""
    from mqttfl.config import config_from_tree
    from mqttfl.nodes.client_state import state_path
    from mqttfl.nodes.manifest import MANIFEST_FILE, read_copy

    client_id = check_id(client_id)
    folder = Path(state_dir) / check_id(run_id, "run id")
    if not Path(state_dir).is_dir():
        raise DataError(state_dir, "state directory not found")
    manifest = read_copy(folder / MANIFEST_FILE)
    config = config_from_tree(dict(manifest.config), f"{folder / MANIFEST_FILE}")
    if config.run_id != run_id:
        raise DataError(folder / MANIFEST_FILE, f"is the manifest of run {config.run_id!r}")
    state_file = state_path(Path(state_dir), run_id, client_id)
    if not state_file.is_file():
        held = sorted(p.name for p in folder.glob("client-*.pt"))
        raise DataError(
            state_file,
            "client state file not found"
            + (f" (this folder holds {', '.join(held)[:200]})" if held else ""),
        )
    return Source(config, state_file, {}, {"state_dir": str(Path(state_dir).resolve())})


def export_client(
    source: Source,
    client_id: str,
    out: Path,
    *,
    shard_dir: Path | None = None,
    with_shard: bool = False,
) -> Exported:
    """Write ``out/model.onnx`` and ``out/sensor.json`` for one client of a finished run
    (and with ``with_shard`` the client's shard as the run built it, in ``out/shard``)."""
    import torch

    from mqttfl.algorithms import get_algorithm, make_context
    from mqttfl.data.sources import run_client_shard
    from mqttfl.nodes.client_state import Progress, StateFile
    from mqttfl.nodes.device import build_client_side
    from mqttfl.training.memory import eval_batch_size

    config, state_file = source.config, source.state_file
    # Read-only: a state that cannot be used stops the export (it is never set aside, and
    # never replaced by an untrained model).
    saved = StateFile(state_file).read()
    metrics = dict(source.scores)
    shard = run_client_shard(config, client_id, shard_dir)
    torch.set_num_threads(config.train.torch_threads)  # the client's (reductions' order)
    algorithm = get_algorithm(config.method)
    method = build_client_side(config, algorithm, make_context(config), client_id, shard)
    progress = Progress()
    StateFile(state_file).load_read_only(method.model, method, progress, state=saved)
    if progress.applied_round < 1:
        raise DataError(state_file, "holds no trained round (the client never applied one)")
    module = method.evaluation_model(progress.applied_round).eval()
    if not metrics:  # on the device: its evaluation of the round it applied last
        from mqttfl.training.metrics import classification_report

        predicted = method.predict(shard.x_test)
        metrics = {"round": progress.applied_round, "num_test": len(shard.y_test)}
        metrics |= classification_report(shard.y_test, predicted)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x = shard.x_test if len(shard.x_test) else shard.x_train
    model_path = out / MODEL_FILE
    # the batches the client evaluates in (bounded activations), so sense's --eval
    # reproduces its figures
    batch = eval_batch_size(module, shard.sample_shape)
    adaptation, checks = None, dict[str, Any]()
    if getattr(method.ctx.params, "adapt_norm", False):
        # the statistics become an input, and what adapts goes into sensor.json
        from mqttfl.export.adaptive import export_adapting

        adaptation, checks = export_adapting(method, config.method, x, batch, model_path, OPSET)
        exporter = str(checks.pop("exporter"))
        deviation = float(checks["max_abs_diff_adaptive_vs_torch"])
        agree = float(checks["transductive_agreement_vs_torch"])
    else:
        exporter = export_onnx(module, np.ascontiguousarray(x[: min(len(x), 4)]), model_path)
        reference = torch_scores(module, x, batch)
        scores = onnx_scores(model_path, x, batch)
        deviation = float(np.max(np.abs(reference - scores))) if reference.size else 0.0
        agree = float(np.mean(reference.argmax(axis=1) == scores.argmax(axis=1))) if len(x) else 1.0

    labels, counts = class_names(shard, config.model.num_classes)
    spec = SensorSpec(
        input_name=INPUT_NAME,
        input_shape=shard.sample_shape,
        output_name=OUTPUT_NAME,
        classes=labels,
        counts=counts,
        preprocess=preprocess_from_shard(shard, where=f"client {client_id}'s shard"),
        run={
            "run_id": config.run_id,
            "method": config.method,
            "client_id": client_id,
            "round": progress.applied_round,
            "arch": method.info.arch,
            "source": config.data.source,
            "device": shard.meta.get("device"),
            **source.origin,
        },
        scores=metrics,
        eval_batch_size=batch,
        export={
            "opset": OPSET,
            "exporter": exporter,
            "torch": torch.__version__,
            "windows_checked": len(x),
            "max_abs_diff_vs_torch": deviation,
            "argmax_agreement": agree,
            **checks,
        },
        adaptation=adaptation,
    )
    spec.write(out)
    if with_shard:
        from mqttfl.data.shard import save_shard

        save_shard(shard, out / "shard")
    return Exported(client_id, out, spec, deviation)
