"""FedAPA-S on the device: its export adapts, `mqttfl sense` adapts without
torch, and `sense --eval` gives the run's own figure.

- the adaptive ONNX graph equals torch with the trained and with the adapted statistics;
- the sensor's layered statistics (numpy + onnxruntime) equal torch's
  (:func:`mqttfl.training.normstats.adapted_statistics`), however they are batched;
- a buffer shorter than ``min_adapt_windows`` keeps the trained statistics;
- `sense --eval` on a tiny FedAPA-S federation reproduces the run's accuracy, F1, MAE and
  its gate's decision; `--stream --curve` writes the curve;
- the state message carries ``adapted`` and ``shift_score``;
- a sensor.json without ``adaptation`` (every export made before adaptation was) still loads, and a
  bad section is a DataError naming its field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mqttfl.errors import DataError
from mqttfl.export.adaptive import AdaptiveGraph, export_adaptive, norm_layers
from mqttfl.models.convnet4 import MiddleConvNet4
from mqttfl.provisioning.local_broker import LocalBroker
from mqttfl.sensing.adapt import Adapter, StreamAdapter, stat_matrix
from mqttfl.sensing.adaptive_spec import AdaptationSpec
from mqttfl.sensing.model import Reading
from mqttfl.sensing.publish import state_message
from mqttfl.sensing.spec import load_spec
from mqttfl.training.loops import embed_all, predict_logits
from mqttfl.training.normstats import adapted_statistics, trained_statistics, with_statistics
from tests._shared_data import require_shared
from tests.sensing_helpers import Recorder, last_metrics, run_and_export, sense

SHAPE = (12, 10)


def _trained_model() -> MiddleConvNet4:
    """A small ConvNet whose running statistics are not the defaults."""
    torch.manual_seed(0)
    model = MiddleConvNet4(num_classes=3, embed_dim=8)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, *SHAPE) * 2 + 1)
    return model.eval()


def _spec(model: MiddleConvNet4, **changes: object) -> AdaptationSpec:
    trained = trained_statistics(model)
    fields: dict[str, object] = {
        "layers": tuple(name for name, _ in norm_layers(model)),
        "channels": tuple(len(m) for m, _ in trained),
        "trained_mean": tuple(m for m, _ in trained),
        "trained_var": tuple(v for _, v in trained),
        "inference": "prototypes",
        "prototypes": np.random.default_rng(0).normal(size=(3, 8)),
        "available": np.array([True, True, False]),
        "refine_steps": 3,
        "min_adapt_windows": 8,
        "tau": 0.5,
        "gate": None,
    }
    fields.update(changes)
    return AdaptationSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[MiddleConvNet4, Adapter]:
    model = _trained_model()
    path = tmp_path_factory.mktemp("graph") / "model.onnx"
    trained = trained_statistics(model)
    export_adaptive(AdaptiveGraph(model), np.zeros((2, *SHAPE), np.float32), trained, path, 18)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return model, Adapter(session, "x", _spec(model))


def _shifted(n: int, seed: int = 1) -> np.ndarray:
    """Windows with another gain and offset than the training's."""
    return (np.random.default_rng(seed).normal(size=(n, *SHAPE)) * 3 - 2).astype(np.float32)


def test_the_graph_equals_torch_with_trained_and_adapted_statistics(
    graph: tuple[MiddleConvNet4, Adapter],
) -> None:
    model, adapter = graph
    x = _shifted(40)
    stats = adapted_statistics(model, x, 16)
    adapted = with_statistics(model, stats)
    for matrix, reference in ((adapter.trained, model), (stat_matrix(stats), adapted)):
        scores = adapter.run(["scores"], x, matrix)[0]
        np.testing.assert_allclose(scores, predict_logits(reference, x, 16), atol=1e-4)
        np.testing.assert_allclose(
            adapter.embeddings(x, matrix), embed_all(reference, x, 16), atol=1e-4
        )
    # the adapted statistics move the scores: the comparison is not of one model with itself
    assert np.abs(predict_logits(adapted, x, 16) - predict_logits(model, x, 16)).max() > 1e-2


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_numpy_layered_statistics_equal_torch_however_batched(
    graph: tuple[MiddleConvNet4, Adapter], batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, adapter = graph
    x = _shifted(30)
    monkeypatch.setattr(adapter, "batch", batch)
    mine = adapter.layered_statistics(x)
    theirs = adapted_statistics(model, x, 16)
    assert len(mine) == len(theirs) == 2
    for (mean, var), (t_mean, t_var) in zip(mine, theirs, strict=True):
        np.testing.assert_allclose(mean, t_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var, t_var, rtol=1e-5, atol=1e-6)
    # the second layer's statistics are those of its input once the first is adapted:
    # with the first layer's trained statistics they would differ
    wrong = adapter.layer_sums(x, adapter.trained, 1).moments()
    assert not np.allclose(wrong[0], theirs[1][0], rtol=1e-3)


def test_a_short_buffer_keeps_the_trained_statistics(graph: tuple[MiddleConvNet4, Adapter]) -> None:
    model, adapter = graph
    stream = StreamAdapter(adapter, buffer=16, horizon_s=100.0, every=4)
    x = _shifted(9)
    for i in range(7):
        scores = stream.read(x[i], float(i), "scores")
        assert not stream.current.adapted
        assert stream.estimates == 0
        np.testing.assert_array_equal(stream.current.stats, adapter.trained)
        np.testing.assert_allclose(scores, predict_logits(model, x[i : i + 1])[0], atol=1e-4)
    stream.read(x[7], 7.0, "scores")  # the 8th window: the first estimate, on all 8
    assert stream.estimates == 1
    assert stream.current.adapted
    assert stream.current.windows == 8
    assert stream.current.prototypes is not None
    # windows older than the horizon leave: the buffer is short again, trained stands
    stream.read(x[8], 500.0, "scores")
    assert stream.held() == 1
    assert not stream.current.adapted
    np.testing.assert_array_equal(stream.current.stats, adapter.trained)


def test_live_estimates_run_off_the_reading_path_and_miss_no_window(
    graph: tuple[MiddleConvNet4, Adapter],
) -> None:
    import asyncio

    _, adapter = graph
    x = _shifted(20)

    async def feed() -> StreamAdapter:
        stream = StreamAdapter(adapter, buffer=16, horizon_s=100.0, every=4)
        for i in range(10):
            stream.read(x[i], float(i), "scores", background=True)
        # the 8th window started the first estimate; the two after it wait for it to end
        assert stream.estimates == 1
        assert not stream.current.adapted
        assert stream.held() == 8
        assert len(stream.waiting) == 2
        await stream.settle()
        return stream

    stream = asyncio.run(feed())
    assert stream.current.adapted
    assert stream.current.windows == 8
    assert stream.held() == 10  # the waiting windows entered the buffer
    assert not stream.waiting


def test_the_gate_keeps_the_trained_model_below_its_threshold(
    graph: tuple[MiddleConvNet4, Adapter],
) -> None:
    from mqttfl.adaptation.shift import ShiftGate

    model, adapter = graph
    x = _shifted(20)
    first = adapter.layer_sums(x, adapter.trained, 0).moments()
    for threshold, adapts in ((1e6, False), (0.0, True)):
        gate = ShiftGate(first[0], first[1] * 4, threshold, "test")
        gated = Adapter(adapter.session, "x", _spec(model, gate=gate))
        adaptation, labels = gated.adapt(x)
        assert adaptation.adapted is adapts
        assert adaptation.score == pytest.approx(gate.shift(*first))  # reported either way
        assert adaptation.ratio is not None
        assert adaptation.ratio > 0
        assert (labels is not None) is adapts
        if not adapts:  # the trained statistics stand
            np.testing.assert_array_equal(adaptation.stats, adapter.trained)


def test_the_state_message_carries_adapted_and_the_shift_score() -> None:
    fixed = Reading(1, "1", 1.0, 0.9, 1_700_000_000.0)
    assert "adapted" not in state_message(fixed)
    reading = Reading(
        1, "1", 1.0, 0.9, 1_700_000_000.0, adapted=True, shift_score=0.51234, fit_ratio=1.2
    )
    assert state_message(reading) == {
        "count": 1,
        "class": "1",
        "confidence": 0.9,
        "window_end": "2023-11-14T22:13:20.000Z",
        "adapted": True,
        "shift_score": 0.5123,
        "fit_ratio": 1.2,
    }
    none = Reading(1, "1", 1.0, 0.9, 0.0, adapted=False, shift_score=None)
    assert state_message(none)["shift_score"] is None


# --- a tiny FedAPA-S federation, exported -----------------------------------------------
SYNTHETIC = [
    "rounds=2",
    "federation.num_clients=2",
    "data.window=24",
    "data.samples_per_client=160",
    "data.device=intel5300",
    "train.lr=0.05",
    "train.local_epochs=2",
    "federation.round_timeout_s=120",
    "method.warmup_rounds=1",
    "method=fedapa-session",
    "model.name=middle",
]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return run_and_export(
        tmp_path_factory.mktemp("fedapa-s"), "configs/fedapa-csi.toml", SYNTHETIC, "0"
    )


@pytest.mark.slow
def test_sense_eval_reproduces_the_fedapa_session_run(federation: tuple[Path, Path]) -> None:
    run, export = federation
    spec = json.loads((export / "sensor.json").read_text())
    assert spec["adaptation"]["format"] == "mqttfl-adapt/1"
    assert spec["export"]["max_abs_diff_adaptive_vs_torch"] <= 1e-4
    assert spec["export"]["transductive_agreement_vs_torch"] == 1.0
    result = sense(str(export), "--input", f"shard:{export / 'shard'}", "--eval", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = json.loads(result.stdout), last_metrics(run, "0")
    for key in ("accuracy", "f1", "mae"):
        assert got[key] == pytest.approx(expected[key], abs=1e-9), key
    assert got["windows"] == expected["num_test"]
    assert got["mode"] == "transductive"
    assert float(got["adapted"]) == expected["adapted"]
    assert got["shift_score"] == pytest.approx(expected["shift_score"], rel=1e-6)
    assert got["fit_ratio"] == pytest.approx(expected["fit_ratio"], rel=1e-5)
    print(
        f"PARITY fedapa-session: run {expected['accuracy']:.4f} {expected['f1']:.4f} "
        f"{expected['mae']:.4f} | sense {got['accuracy']:.4f} {got['f1']:.4f} {got['mae']:.4f}"
    )


@pytest.mark.slow
def test_sense_eval_reproduces_fedapa_session_on_espectre(tmp_path: Path) -> None:
    """Real sessions (a chip's held-out day), a model that answers both classes, and the
    gate's decision as the run made it."""
    root = require_shared("espectre")
    overrides = [
        "rounds=3",
        "federation.num_clients=2",
        "data.split=session",
        "method=fedapa-session",
        "method.warmup_rounds=1",
        f"data.path={root.parent}",
    ]
    run, export = run_and_export(tmp_path, "configs/presence-espectre.toml", overrides, "0")
    result = sense(str(export), "--input", f"shard:{export / 'shard'}", "--eval", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = json.loads(result.stdout), last_metrics(run, "0")
    for key in ("accuracy", "f1", "mae"):
        assert got[key] == pytest.approx(expected[key], abs=1e-9), key
    assert float(got["adapted"]) == expected["adapted"]
    assert got["f1"] > 0.5, "a constant model: the parity says little"


@pytest.mark.slow
def test_sense_eval_in_stream_order_writes_its_curve(
    federation: tuple[Path, Path], tmp_path: Path
) -> None:
    _, export = federation
    curve_file = tmp_path / "curve.json"
    result = sense(
        str(export), "--input", f"shard:{export / 'shard'}", "--eval", "--json", "--stream",
        "--buffer", "32", "--curve", str(curve_file),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout)
    document = json.loads(curve_file.read_text())
    assert got["mode"] == document["mode"] == "stream"
    curve = document["curve"]
    assert curve[0]["windows_seen"] == 8  # min_adapt_windows: the first estimate
    assert curve[-1]["windows_seen"] == got["windows"]
    assert curve[-1]["stream_accuracy"] == pytest.approx(got["accuracy"])
    assert max(point["buffer"] for point in curve) == 32


@pytest.mark.slow
def test_published_readings_carry_adapted_and_the_score(
    federation: tuple[Path, Path], broker: LocalBroker
) -> None:
    _, export = federation
    recorder = Recorder(broker.port)
    try:
        result = sense(
            str(export), "--input", f"shard:{export / 'shard'}", "--broker", broker.url,
            "--name", "adapting", "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        recorder.wait_for("mqttfl/sensor/adapting/availability", b"offline")
        states = [json.loads(p) for p in recorder.on("mqttfl/sensor/adapting/state")]
    finally:
        recorder.close()
    assert len(states) == len(result.stdout.splitlines()) > 8
    # below min_adapt_windows the trained model; live, the first estimate (on 8 windows)
    # is made off the reading path, so it is in force from some reading after the 7th on
    assert all(s["adapted"] is False and s["shift_score"] is None for s in states[:7])
    assert all(isinstance(s["adapted"], bool) for s in states)
    scored = [i for i, s in enumerate(states) if s["shift_score"] is not None]
    assert scored
    assert scored == list(range(scored[0], len(states)))
    assert all(isinstance(states[i]["fit_ratio"], float) for i in scored)


@pytest.mark.slow
def test_an_old_sensor_json_still_loads_and_a_bad_section_is_named(
    federation: tuple[Path, Path], tmp_path: Path
) -> None:
    _, export = federation
    data = json.loads((export / "sensor.json").read_text())
    old = {k: v for k, v in data.items() if k != "adaptation"}
    (tmp_path / "sensor.json").write_text(json.dumps(old))
    assert load_spec(tmp_path).adaptation is None
    assert load_spec(export).adaptation is not None
    for change, field in (
        ({"refine_steps": -1}, "adaptation.refine_steps"),
        ({"format": "mqttfl-adapt/9"}, "adaptation.format"),
        ({"available": [True]}, "adaptation.available"),
        ({"gate": {**data["adaptation"]["gate"], "threshold": "x"}}, "adaptation.gate.threshold"),
    ):
        broken = {**data, "adaptation": {**data["adaptation"], **change}}
        (tmp_path / "sensor.json").write_text(json.dumps(broken))
        with pytest.raises(DataError, match=field.replace(".", r"\.")):
            load_spec(tmp_path)
