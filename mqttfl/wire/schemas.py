"""Permitted payloads: what a message body may hold, field by field.

Each algorithm declares a :class:`PayloadSchema` for its uploads. The client runner
validates a body against it before publishing (it refuses anything else), and the
coordinator validates every upload against it on decode. Symbolic dimensions (``"k"``)
must agree across the fields of one body and lie within the declared bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mqttfl.errors import WireError


@dataclass(frozen=True)
class ArrayField:
    dtype: str
    shape: tuple[int | str, ...]
    min_value: float | None = None
    max_value: float | None = None
    unique: bool = False

    def check(
        self, name: str, value: Any, dims: dict[str, int], bounds: Mapping[str, tuple[int, int]]
    ) -> None:
        if not isinstance(value, np.ndarray):
            raise WireError("type", f"field '{name}' must be an array, got {type(value).__name__}")
        if value.dtype != np.dtype(self.dtype):
            raise WireError(
                "dtype", f"field '{name}' has dtype {value.dtype}, expected {self.dtype}"
            )
        if value.ndim != len(self.shape):
            raise WireError(
                "shape", f"field '{name}' has shape {value.shape}, expected {self.shape}"
            )
        for axis, (want, got) in enumerate(zip(self.shape, value.shape, strict=True)):
            if isinstance(want, int):
                if got != want:
                    raise WireError(
                        "shape", f"field '{name}' axis {axis} is {got}, expected {want}"
                    )
                continue
            low, high = bounds.get(want, (0, 2**31))
            if not low <= got <= high:
                raise WireError("shape", f"field '{name}' dim {want}={got} outside [{low}, {high}]")
            if dims.setdefault(want, got) != got:
                raise WireError(
                    "shape", f"field '{name}' dim {want}={got} disagrees with {dims[want]}"
                )
        if value.dtype.kind == "f" and value.size and not np.isfinite(value).all():
            raise WireError("non_finite", f"field '{name}' holds NaN or Inf")
        if value.size and self.min_value is not None and value.min() < self.min_value:
            raise WireError("range", f"field '{name}' has values below {self.min_value}")
        if value.size and self.max_value is not None and value.max() > self.max_value:
            raise WireError("range", f"field '{name}' has values above {self.max_value}")
        if self.unique and len(np.unique(value)) != value.size:
            raise WireError("range", f"field '{name}' repeats values")


@dataclass(frozen=True)
class IntField:
    min_value: int = 0
    max_value: int = 2**62

    def check(
        self, name: str, value: Any, dims: dict[str, int], bounds: Mapping[str, tuple[int, int]]
    ) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError("type", f"field '{name}' must be an integer")
        if not self.min_value <= value <= self.max_value:
            raise WireError(
                "range", f"field '{name}'={value} outside [{self.min_value}, {self.max_value}]"
            )


@dataclass(frozen=True)
class FloatField:
    min_value: float = -np.inf
    max_value: float = np.inf

    def check(
        self, name: str, value: Any, dims: dict[str, int], bounds: Mapping[str, tuple[int, int]]
    ) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError("type", f"field '{name}' must be a number")
        if not np.isfinite(value):
            raise WireError("non_finite", f"field '{name}' is NaN or Inf")
        if not self.min_value <= value <= self.max_value:
            raise WireError(
                "range", f"field '{name}'={value} outside [{self.min_value}, {self.max_value}]"
            )


Field = ArrayField | IntField | FloatField


#: A message body: named fields, each an array, a number, a string or a map of them. The
#: schema checks an upload's; a method reads its own through its TypedDict.
Body = Mapping[str, object]


@dataclass(frozen=True)
class PayloadSchema:
    """Exactly the fields a body may hold; every field is required."""

    fields: Mapping[str, Field]
    dims: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Largest magnitude any float array may hold (the method's bound; None: only finite).
    value_bound: float | None = None

    def validate(self, body: Mapping[str, Any]) -> dict[str, int]:
        """Raise WireError for unknown, missing or malformed fields; return the bound dims."""
        unknown = sorted(str(k) for k in body.keys() - self.fields.keys())
        if unknown:
            raise WireError("unknown_field", f"fields not permitted: {unknown}")
        missing = sorted(self.fields.keys() - body.keys())
        if missing:
            raise WireError("missing_field", f"missing fields: {missing}")
        dims: dict[str, int] = {}
        for name, spec in self.fields.items():
            value = body[name]
            spec.check(name, value, dims, self.dims)
            if (
                self.value_bound is not None
                and isinstance(value, np.ndarray)
                and (
                    value.dtype.kind == "f"
                    and value.size
                    and np.abs(value).max() > self.value_bound
                )
            ):
                raise WireError("range", f"field '{name}' has values beyond ±{self.value_bound:g}")
        return dims

    def max_bytes(self) -> int:
        """Upper bound of the array bytes a valid body can carry (for sizing limits)."""
        total = 0
        for spec in self.fields.values():
            if isinstance(spec, ArrayField):
                n = 1
                for d in spec.shape:
                    n *= d if isinstance(d, int) else self.dims.get(d, (0, 1))[1]
                total += n * np.dtype(spec.dtype).itemsize
            else:
                total += 9
        return total


EMPTY = PayloadSchema(fields={})


@dataclass(frozen=True)
class ClientInfo:
    """What a client announced on its status topic: model, classes, sample count, and the
    site (edge broker) it is behind, if any."""

    client_id: str
    arch: str
    classes: tuple[int, ...]
    num_samples: int
    sample_shape: tuple[int, ...]
    site: str = ""
