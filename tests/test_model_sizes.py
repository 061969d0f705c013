"""The torch-free weight counts equal what torch's models hold, for every model."""

from __future__ import annotations

import itertools

import pytest

from mqttfl.algorithms.common.weights import float_entries
from mqttfl.models import build_model
from mqttfl.models.names import MODEL_NAMES
from mqttfl.models.sizes import alp_widths, weight_count


@pytest.mark.parametrize("arch", MODEL_NAMES)
@pytest.mark.parametrize(
    ("num_classes", "embed_dim"), list(itertools.product((2, 10, 21), (8, 64, 256)))
)
def test_the_count_is_torch_s_for_every_model(arch: str, num_classes: int, embed_dim: int) -> None:
    for input_dim in (4, 420) if arch == "mlp" else (None,):
        model = build_model(arch, num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)
        torch_count = sum(v.numel() for _, v in float_entries(model))
        assert (
            weight_count(arch, num_classes=num_classes, embed_dim=embed_dim, input_dim=input_dim)
            == torch_count
        )


def test_an_unknown_model_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        weight_count("resnet", num_classes=2, embed_dim=8, input_dim=None)
    with pytest.raises(ValueError, match="input_dim"):
        weight_count("mlp", num_classes=2, embed_dim=8, input_dim=None)


@pytest.mark.parametrize("arch", MODEL_NAMES)
def test_alp_widths_are_the_model_s(arch: str) -> None:
    model = build_model(arch, num_classes=4, embed_dim=8, input_dim=6)
    layers = getattr(model, "alp_layers", None)
    want = tuple(layer.dim for layer in layers()) if layers is not None else ()
    assert alp_widths(arch) == want
