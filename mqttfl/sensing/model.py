"""The exported model under onnxruntime, checked against ``sensor.json`` when loaded.

A model that adapts (sensor.json's ``adaptation``) takes its normalization statistics as a
second input; :meth:`SensorModel.scores` feeds the trained ones, and :attr:`adapter`
(:mod:`mqttfl.sensing.adapt`) adapts it to the windows it sees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mqttfl.errors import DataError
from mqttfl.sensing.adapt import Adapter
from mqttfl.sensing.spec import SPEC_FILE, SensorSpec


@dataclass(frozen=True)
class Reading:
    """One window's answer."""

    klass: int
    label: str
    count: float  # the class's number (people), or its index where classes are names
    confidence: float  # softmax of the scores at the chosen class
    end_time: float
    finite: bool = True  # False: the model's scores were NaN or infinite (never published)
    adapted: bool | None = None  # a model that adapts: whether this reading's model did
    shift_score: float | None = None  # the gate's shift score of the windows it decided on
    fit_ratio: float | None = None  # and its fit ratio (adapts where >= its threshold)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64; a row with a NaN or infinite score comes out NaN
    (quietly: the caller checks)."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = scores - scores.max(axis=-1, keepdims=True)
        e: np.ndarray = np.exp(shifted.astype(np.float64))
        out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


class SensorModel:
    def __init__(self, directory: Path, spec: SensorSpec, *, threads: int = 1) -> None:
        import onnxruntime as ort

        self.spec = spec
        path = Path(directory) / spec.model_file
        if not path.is_file():
            raise DataError(path, "model file not found (sensor.json model_file)")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise DataError(path, f"not a loadable ONNX model: {str(exc)[:200]}") from None
        self._check(Path(directory) / SPEC_FILE)
        adaptation = spec.adaptation
        self.adapter = (
            None if adaptation is None else Adapter(self.session, spec.input_name, adaptation)
        )

    def _check(self, spec_path: Path) -> None:
        """DataError naming sensor.json's field that does not match the ONNX graph."""
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        adaptation = self.spec.adaptation
        expected = [self.spec.input_name]
        if adaptation is not None and adaptation.normalizes:
            expected.append(adaptation.statistics_input)
        if [i.name for i in inputs] != expected:
            names = [i.name for i in inputs]
            if adaptation is None:
                raise DataError(
                    spec_path,
                    f"input.name is {self.spec.input_name!r}, the model's inputs are {names}",
                )
            raise DataError(
                spec_path,
                f"input.name and adaptation.statistics_input are {expected}, the model's "
                f"inputs are {names}",
            )
        sample = tuple(inputs[0].shape[1:])
        if sample != self.spec.input_shape:
            raise DataError(
                spec_path,
                f"input.shape is {list(self.spec.input_shape)}, the model takes samples of "
                f"{list(sample)}",
            )
        by_name = {o.name: o for o in outputs}
        if self.spec.output_name not in by_name:
            raise DataError(
                spec_path,
                f"output.name is {self.spec.output_name!r}, the model's outputs are {list(by_name)}",
            )
        width = by_name[self.spec.output_name].shape[-1]
        if isinstance(width, int) and width != self.spec.num_classes:
            raise DataError(
                spec_path,
                f"classes lists {self.spec.num_classes} classes, the model scores {width}",
            )
        if adaptation is not None:
            self._check_adaptive(spec_path, inputs[-1].shape, by_name)

    def _check_adaptive(
        self, spec_path: Path, stats_shape: list[Any], by_name: dict[str, Any]
    ) -> None:
        adaptation = self.spec.adaptation
        assert adaptation is not None
        total = sum(adaptation.channels)
        if adaptation.normalizes and list(stats_shape) != [2, total]:
            raise DataError(
                spec_path,
                f"adaptation.layers has {total} channels in all, the model's statistics "
                f"input is {list(stats_shape)}",
            )
        keys = ("embedding_output", "moments_output", "counts_output")
        for key in keys if adaptation.normalizes else keys[:1]:
            name = getattr(adaptation, key)
            if name not in by_name:
                raise DataError(
                    spec_path,
                    f"adaptation.{key} is {name!r}, the model's outputs are {list(by_name)}",
                )
        counts = by_name[adaptation.counts_output].shape if adaptation.normalizes else []
        if adaptation.normalizes and list(counts) != [len(adaptation.channels)]:
            raise DataError(
                spec_path,
                f"adaptation.layers lists {len(adaptation.channels)} layers, the model reports "
                f"moments of {counts}",
            )
        width = by_name[adaptation.embedding_output].shape[-1]
        if adaptation.prototypes is not None and width != adaptation.prototypes.shape[1]:
            raise DataError(
                spec_path,
                f"adaptation.prototypes have {adaptation.prototypes.shape[1]} dimensions, the "
                f"model's embedding {width}",
            )

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Class scores of a batch of samples (n, *input.shape)."""
        feed = {self.spec.input_name: np.ascontiguousarray(x, dtype=np.float32)}
        if self.adapter is not None and self.adapter.spec.normalizes:
            feed[self.adapter.spec.statistics_input] = self.adapter.trained
        return np.asarray(self.session.run([self.spec.output_name], feed)[0])

    def readings(self, x: np.ndarray, end_times: list[float]) -> list[Reading]:
        return self.readings_of(self.scores(x), end_times)

    def readings_of(
        self,
        scores: np.ndarray,
        end_times: list[float],
        *,
        adapted: bool | None = None,
        shift_score: float | None = None,
        fit_ratio: float | None = None,
    ) -> list[Reading]:
        """One reading per row of class scores (an adapted model's: ``adapted`` and the
        gate's score go with each)."""
        probabilities = softmax(scores)
        out = []
        finite = np.isfinite(probabilities).all(axis=-1) & np.isfinite(scores).all(axis=-1)
        for row, end in zip(range(len(scores)), end_times, strict=True):
            k = int(scores[row].argmax())
            count = self.spec.counts[k]
            out.append(
                Reading(
                    klass=k,
                    label=self.spec.classes[k],
                    count=float(k if count is None else count),
                    confidence=float(probabilities[row, k]),
                    end_time=end,
                    finite=bool(finite[row]),
                    adapted=adapted,
                    shift_score=shift_score,
                    fit_ratio=fit_ratio,
                )
            )
        return out
