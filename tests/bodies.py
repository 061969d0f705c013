"""Reading and forging message bodies in tests: a body is a Mapping of objects, and a
test knows which of its fields are arrays and which are maps."""

from __future__ import annotations

from typing import Any

import numpy as np

from mqttfl.wire.schemas import Body


def array(body: Body, *path: str) -> np.ndarray:
    """The array at ``path`` (keys into nested maps)."""
    value: object = body
    for key in path:
        assert isinstance(value, dict), f"{path}: {key!r} is not in a map"
        value = value[key]
    assert isinstance(value, np.ndarray), f"{path} is a {type(value).__name__}, not an array"
    return value


def number(body: Body, key: str) -> float:
    """The number at ``key``."""
    value = body[key]
    assert isinstance(value, (int, float)), f"{key!r} is a {type(value).__name__}"
    return float(value)


def mapping(body: Body, key: str) -> dict[str, Any]:
    """The map at ``key``."""
    value = body[key]
    assert isinstance(value, dict), f"{key!r} is a {type(value).__name__}, not a map"
    return value


def editable(body: Body) -> dict[str, Any]:
    """A copy of ``body`` a test may change (to forge an upload)."""
    return dict(body)
