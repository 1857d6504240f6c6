"""Convert an EtaModel to one ONNX graph with two named outputs, check it, and prove parity with the native model.

skl2onnx converts each boosted model; the two graphs are prefixed and joined on one input, and the
confidence formula is added as plain ONNX ops, so Triton serves a single model with both outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrelease.model.estimator import EtaModel
from mlrelease.release_spec import only_spec

INPUT = "features"
OUTPUTS = only_spec().prediction_and_score()  # the graph below has exactly these two outputs
OPSET = {"": 17, "ai.onnx.ml": 3}


def _booster_graph(model: Any, n_features: int, prefix: str) -> Any:
    import onnx.compose
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(model, initial_types=[(INPUT, FloatTensorType([None, n_features]))], target_opset=OPSET)
    return onnx.compose.add_prefix(onx, prefix=prefix)


def to_onnx(model: EtaModel) -> bytes:
    """Serialized ONNX model: input `features` float32 [N, F]; outputs `eta_prediction`, `confidence_score` [N, 1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = int(model.n_features_in_)
    point = _booster_graph(model.point_, n, "point_")
    spread = _booster_graph(model.spread_, n, "spread_")
    point_out, spread_out = point.graph.output[0].name, spread.graph.output[0].name
    consts = [
        numpy_helper.from_array(np.array([0.0], dtype=np.float32), "zero"),
        numpy_helper.from_array(np.array([-model.k_], dtype=np.float32), "neg_k"),
    ]
    nodes = [
        helper.make_node("Identity", [INPUT], [point.graph.input[0].name]),
        helper.make_node("Identity", [INPUT], [spread.graph.input[0].name]),
        *point.graph.node,
        *spread.graph.node,
        helper.make_node("Identity", [point_out], [OUTPUTS[0]]),
        helper.make_node("Max", [spread_out, "zero"], ["expected_error"]),
        helper.make_node("Mul", ["expected_error", "neg_k"], ["confidence_logit"]),
        helper.make_node("Exp", ["confidence_logit"], [OUTPUTS[1]]),
    ]
    graph = helper.make_graph(
        nodes,
        only_spec().name,
        inputs=[helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [None, n])],
        outputs=[helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 1]) for name in OUTPUTS],
        initializer=[*point.graph.initializer, *spread.graph.initializer, *consts],
    )
    onx = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in OPSET.items()],
        producer_name="mlrelease",
    )
    onx.ir_version = point.ir_version
    onnx.checker.check_model(onx, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(onx, strict_mode=True)
    return inferred.SerializeToString()


def run_onnx(model_bytes: bytes, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eta, confidence) from onnxruntime on CPU, flattened to 1-D."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    eta, confidence = session.run(list(OUTPUTS), {INPUT: features.astype(np.float32)})
    return eta.reshape(-1), confidence.reshape(-1)


@dataclass(frozen=True)
class Parity:
    """How far the ONNX outputs are from the native model's on a sample."""

    rows: int
    max_abs_diff_eta: float
    max_abs_diff_confidence: float

    def ok(self, tolerance: float) -> bool:
        """Both outputs within `tolerance` on every sampled row."""
        return max(self.max_abs_diff_eta, self.max_abs_diff_confidence) <= tolerance


def parity(model: EtaModel, model_bytes: bytes, features: np.ndarray) -> Parity:
    """Compare ONNX and native outputs on `features`."""
    eta_native, conf_native = model.predict_with_confidence(features)
    eta_onnx, conf_onnx = run_onnx(model_bytes, features)
    return Parity(
        rows=len(features),
        max_abs_diff_eta=float(np.max(np.abs(eta_onnx - eta_native))),
        max_abs_diff_confidence=float(np.max(np.abs(conf_onnx - conf_native))),
    )
