"""Each method's evaluation model (what `mqttfl export` writes) predicts what its client's
``predict`` does, and every shipped architecture traces to ONNX within 1e-4 of torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mqttfl.algorithms import algorithm_names
from mqttfl.export.client import export_onnx, onnx_scores
from mqttfl.models import build_model
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.scoring import Logits
from tests.inprocess import Federation

CASES: list[tuple[str, str, dict[str, Any]]] = [
    (name, "transformer" if name == "fedali" else "middle", {})
    for name in algorithm_names()
    if name != "fedapa-session"  # adapts per session: no fixed model (tested below)
] + [
    ("fedproto", "middle", {"inference": "prototype"}),
    ("fedsap", "tiny", {"inference": "prototype"}),
]


@pytest.mark.parametrize(("name", "arch", "params"), CASES, ids=lambda v: str(v or ""))
def test_the_evaluation_model_argmax_is_the_clients_prediction(
    name: str, arch: str, params: dict[str, Any]
) -> None:
    fed = Federation(name, arch=arch, **params).run()
    for client in fed.clients:
        x = client.shard.x_test
        predicted = client.predict(x)
        module = client.evaluation_model(fed.ctx.rounds).eval()
        with torch.no_grad():
            scores = module(torch.from_numpy(x)).numpy()
        assert scores.shape == (len(x), fed.ctx.num_classes)
        np.testing.assert_array_equal(scores.argmax(axis=1), predicted)


def test_prototype_inference_scores_are_negative_distances_to_the_bank() -> None:
    fed = Federation("fedproto", inference="prototype").run()
    client = fed.clients[0]
    module = client.evaluation_model(2).eval()
    assert type(module).__name__ == "NearestPrototype"
    x = torch.from_numpy(client.shard.x_test)
    with torch.no_grad():
        z = client.model.embed(x)
        scores = module(x)
    bank, available = client.bank, client.available  # type: ignore[attr-defined]
    expected = -torch.cdist(z, bank)
    np.testing.assert_allclose(
        scores[:, available].numpy(), expected[:, available].numpy(), atol=1e-5
    )
    assert (scores[:, ~available] <= -1e8).all()


@pytest.mark.parametrize("arch", MODEL_NAMES)
def test_every_architecture_exports_to_onnx_within_1e_4_of_torch(arch: str, tmp_path: Path) -> None:
    window, subcarriers = 24, 30
    torch.manual_seed(0)
    model = build_model(
        arch, num_classes=6, embed_dim=32, input_dim=window * subcarriers if arch == "mlp" else None
    )
    if arch == "transformer":  # FedAli's ALP layers, as a FedAli client attaches them
        for layer in model.alp_layers():  # type: ignore[operator]
            start = torch.randn(4, layer.dim)
            layer.attach(start, start, beta=0.2, gamma=0.999, epsilon=0.05, iterations=3)
    module = Logits(model).eval()
    x = np.random.default_rng(0).normal(size=(300, window, subcarriers)).astype(np.float32)
    path = tmp_path / "model.onnx"
    exporter = export_onnx(module, x[:4], path)
    # the TorchScript exporter refuses an adaptive pool whose output does not divide its
    # input (the image CNN's, the transformer's); the dynamo exporter traces those
    assert exporter == ("dynamo" if arch in {"cnn", "transformer"} else "torchscript")
    with torch.no_grad():
        expected = torch.cat([module(torch.from_numpy(x[i : i + 256])) for i in (0, 256)]).numpy()
    got = onnx_scores(path, x, 256)  # a batch of 256, then one of 44: the batch axis is free
    assert got.shape == expected.shape
    assert float(np.max(np.abs(got - expected))) <= 1e-4


def test_fedapa_s_evaluation_model_is_what_predicts_a_session_it_does_not_adapt_to() -> None:
    """Below min_adapt_windows FedAPA-S keeps the trained statistics and predicts with the
    trained head: the exported fixed model (export adds what adapts)."""
    fed = Federation("fedapa-session", arch="middle", min_adapt_windows=10_000).run()
    for client in fed.clients:
        x = client.shard.x_test
        module = client.evaluation_model(fed.ctx.rounds).eval()
        with torch.no_grad():
            scores = module(torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(scores.argmax(axis=1), client.predict(x))


EXPORT_WITHOUT_COMPILER = """
import sys
from pathlib import Path
import numpy as np
from mqttfl.export.adaptive import AdaptiveGraph, export_adaptive
from mqttfl.export.client import export_onnx
from mqttfl.models import build_model
from mqttfl.models.scoring import Logits
from mqttfl.training.normstats import trained_statistics

out = Path(sys.argv[1])
model = build_model("large", num_classes=21, embed_dim=64).eval()
x = np.zeros((4, 50, 242), np.float32)
fixed = export_onnx(Logits(model).eval(), x, out / "fixed.onnx")
adaptive = export_adaptive(AdaptiveGraph(model), x, trained_statistics(model), out / "a.onnx", 18)
print(fixed, adaptive, "torch._dynamo" in sys.modules)
"""


def test_a_csi_model_and_its_adaptive_graph_export_without_torchs_compiler(
    tmp_path: Path,
) -> None:
    """The ConvNet4s trace with the TorchScript exporter, in a fresh process: torch's
    compiler stack (which the dynamo exporter imports, about 130 MB) is never loaded."""
    done = subprocess.run(
        [sys.executable, "-c", EXPORT_WITHOUT_COMPILER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torchscript", "torchscript", "False"]
    assert (tmp_path / "fixed.onnx").stat().st_size > 0
    assert (tmp_path / "a.onnx").stat().st_size > 0
