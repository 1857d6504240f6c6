"""Convert a fitted model to one ONNX graph with the release spec's two named outputs, check it, prove parity.

The platform owns export: a model that knows its own graph (`to_onnx(input_name, outputs, opset)`, as EtaModel
does) builds it; a binary classifier (sklearn's `predict_proba`) is converted by skl2onnx and its P(1) becomes the
score output and `P(1) >= DECISION_THRESHOLD` (as 0.0/1.0) the prediction output. Every graph is checked (full
check) and strictly shape-inferred here, so Triton serves a single model whose outputs are the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrelease.errors import StepError
from mlrelease.release_spec import process_spec

INPUT = "features"
OUTPUTS = process_spec().prediction_and_score()  # (prediction, score): every exported graph has exactly these
OPSET = {"": 17, "ai.onnx.ml": 3}
DECISION_THRESHOLD = 0.5  # a classifier's prediction is 1.0 where P(1) reaches this


def to_onnx(model: Any) -> bytes:
    """Serialized ONNX: input `features` float32 [N, F]; the spec's (prediction, score) outputs, float32 [N, 1]."""
    import onnx

    if callable(getattr(model, "to_onnx", None)):
        onx = model.to_onnx(INPUT, OUTPUTS, OPSET)
    elif callable(getattr(model, "predict_proba", None)):
        onx = _classifier_graph(model)
    else:
        raise StepError(
            f"{type(model).__name__} can be exported neither by itself (to_onnx(input_name, outputs, opset)) nor as "
            "a binary classifier (predict_proba)"
        )
    onx.graph.name = process_spec().name  # the served model's name, whoever built the graph
    onnx.checker.check_model(onx, full_check=True)
    return onnx.shape_inference.infer_shapes(onx, strict_mode=True).SerializeToString()


def _classifier_graph(model: Any) -> Any:
    """skl2onnx's graph of a binary classifier, ending in the spec's prediction (0/1) and score (P(1)) outputs."""
    from onnx import TensorProto, helper, numpy_helper
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    classes = [int(c) for c in getattr(model, "classes_", [])]
    if classes != [0, 1]:
        raise StepError(f"a binary classifier's classes must be [0, 1] (P(1) is the score), got {classes}")
    n = int(model.n_features_in_)
    converted = convert_sklearn(
        model,
        initial_types=[(INPUT, FloatTensorType([None, n]))],
        target_opset=OPSET,
        options={id(model): {"zipmap": False}},  # probabilities as a float tensor [N, 2], not a list of maps
    )
    source = converted.graph
    probabilities = next(o.name for o in source.output if o.type.tensor_type.elem_type == TensorProto.FLOAT)
    prediction, score = OUTPUTS
    consts = [
        numpy_helper.from_array(np.array([1], dtype=np.int64), "p1_start"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "p1_end"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "p1_axis"),
        numpy_helper.from_array(np.array(DECISION_THRESHOLD, dtype=np.float32), "decision_threshold"),
    ]
    nodes = [
        *source.node,
        helper.make_node("Slice", [probabilities, "p1_start", "p1_end", "p1_axis"], [score]),
        helper.make_node("GreaterOrEqual", [score, "decision_threshold"], ["is_positive"]),
        helper.make_node("Cast", ["is_positive"], [prediction], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        source.name,
        inputs=list(source.input),
        outputs=[helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 1]) for name in OUTPUTS],
        initializer=[*source.initializer, *consts],
        value_info=list(source.output),  # the converter's own outputs stay typed inside the graph
    )
    onx = helper.make_model(graph, opset_imports=list(converted.opset_import), producer_name="mlrelease")
    onx.ir_version = converted.ir_version
    return onx


def native_outputs(model: Any, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, score) of the fitted model itself, computed as the exported graph computes them."""
    if callable(getattr(model, "predict_with_confidence", None)):
        prediction, score = model.predict_with_confidence(features)
        return np.asarray(prediction, dtype=np.float64), np.asarray(score, dtype=np.float64)
    probability = np.asarray(model.predict_proba(features), dtype=np.float64)[:, 1]
    return (probability >= DECISION_THRESHOLD).astype(np.float64), probability


def run_onnx(model_bytes: bytes, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, score) from onnxruntime on CPU, flattened to 1-D."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    prediction, score = session.run(list(OUTPUTS), {INPUT: features.astype(np.float32)})
    return prediction.reshape(-1), score.reshape(-1)


@dataclass(frozen=True)
class Parity:
    """How far the ONNX outputs are from the native model's on a sample: the largest |diff| per output name."""

    rows: int
    max_abs_diff: dict[str, float]

    def ok(self, tolerance: float) -> bool:
        """Every output within `tolerance` on every sampled row."""
        return self.worst() <= tolerance

    def worst(self) -> float:
        """The largest difference over all outputs."""
        return max(self.max_abs_diff.values())

    def describe(self) -> str:
        """`name diff, name diff` for an error message."""
        return ", ".join(f"{name} {diff:.2e}" for name, diff in self.max_abs_diff.items())


def parity(model: Any, model_bytes: bytes, features: np.ndarray) -> Parity:
    """Compare ONNX and native outputs on `features`."""
    native = native_outputs(model, features)
    served = run_onnx(model_bytes, features)
    return Parity(
        rows=len(features),
        max_abs_diff={name: float(np.max(np.abs(s - n))) for name, s, n in zip(OUTPUTS, served, native, strict=True)},
    )
