"""Models of FedAPA Table II, the registry and the FLOP counter."""

from __future__ import annotations

import pytest
import torch

from mqttfl.models import MODEL_NAMES, EmbeddingModel, build_model
from mqttfl.models.flops import count_flops, count_parameters, describe_models

torch.set_num_threads(1)

PAPER_PARAMS = {"tiny": 7_956, "middle": 18_436, "large": 463_748}
OURS = ("tiny", "middle", "large", "mlp")  # other models register themselves too


@pytest.mark.parametrize(("name", "expected"), sorted(PAPER_PARAMS.items()))
def test_parameter_counts_match_table_ii(name: str, expected: int) -> None:
    model = build_model(name, num_classes=20, embed_dim=256)
    assert count_parameters(model) == expected


@pytest.mark.parametrize("name", ["tiny", "middle", "large"])
@pytest.mark.parametrize("shape", [(2, 64, 30), (2, 1, 64, 242), (3, 1, 1), (2, 7, 5)])
def test_conv_forward_shapes(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, num_classes=21, embed_dim=64).eval()
    with torch.no_grad():
        logits, z = model(torch.randn(shape))
    assert logits.shape == (shape[0], 21)
    assert z.shape == (shape[0], 64)


@pytest.mark.parametrize("name", OURS)
def test_interface_is_consistent(name: str) -> None:
    model = build_model(name, num_classes=5, embed_dim=32, input_dim=40).eval()
    assert isinstance(model, EmbeddingModel)
    assert (model.arch, model.embed_dim, model.num_classes) == (name, 32, 5)
    x = torch.randn(4, 8, 5) if model.sample_ndim == 2 else torch.randn(4, 40)
    with torch.no_grad():
        logits, z = model(x)
        assert torch.allclose(model.embed(x), z)
        assert torch.allclose(model.classify(z), logits)
    # the classifier is g(z; w^c), kept under its own state_dict prefix
    assert {k for k in model.state_dict() if k.startswith("classifier.")} == {
        "classifier.weight",
        "classifier.bias",
    }


def test_mlp_shapes_and_input_dim() -> None:
    model = build_model("mlp", num_classes=21, input_dim=12)
    logits, z = model(torch.randn(3, 12))
    assert logits.shape == (3, 21)
    assert z.shape == (3, 256)
    with pytest.raises(ValueError, match="12 features"):
        model(torch.randn(3, 13))
    with pytest.raises(ValueError, match="input_dim"):
        build_model("mlp", num_classes=21)


def test_unknown_model_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="allowed: tiny, middle, large, mlp") as info:
        build_model("resnet", num_classes=21)
    assert all(name in str(info.value) for name in MODEL_NAMES)
    assert MODEL_NAMES[:4] == OURS


def test_conv_rejects_bad_input_rank() -> None:
    model = build_model("tiny", num_classes=21)
    with pytest.raises(ValueError, match="expected input"):
        model(torch.randn(2, 3, 8, 8))


def test_tiny_flops_match_the_closed_form() -> None:
    model = build_model("tiny", num_classes=20)
    # conv: 2 * 9 * E MACs per output pixel of a stride-2 grid; linear: 2 * E * C
    for h, w in [(64, 242), (128, 484), (31, 7)]:
        pixels = ((h + 1) // 2) * ((w + 1) // 2)
        assert count_flops(model, (h, w)) == 2 * 9 * 256 * pixels + 2 * 256 * 20


def test_flops_scale_with_input_area() -> None:
    for name in ("tiny", "middle", "large"):
        model = build_model(name, num_classes=20)
        small, big = count_flops(model, (64, 64)), count_flops(model, (128, 128))
        assert isinstance(small, int)
        assert small > 0
        assert 3.5 < big / small <= 4.0


def test_count_flops_restores_training_mode() -> None:
    model = build_model("middle", num_classes=20).train()
    count_flops(model, (16, 16))
    assert model.training


def test_describe_models_lists_every_model() -> None:
    rows = describe_models(20, (16, 30))
    assert [r["name"] for r in rows] == list(MODEL_NAMES)
    by_name = {r["name"]: r for r in rows}
    for name, params in PAPER_PARAMS.items():
        assert by_name[name]["parameters"] == params
        assert by_name[name]["input_shape"] == [16, 30]
    assert by_name["mlp"]["input_shape"] == [480]
    assert all(r["flops"] > 0 for r in rows)
