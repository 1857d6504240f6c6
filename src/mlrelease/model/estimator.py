"""A two-output ETA estimator: a point prediction plus a confidence that falls as the expected error grows.

The confidence comes from a second gradient-boosted model trained on the point model's out-of-fold
absolute errors, so it learns where the point model is unreliable (remote routes, bulky parcels…).
confidence = exp(-k * expected_abs_error_hours), with k set on the training data so that the
`calibration_quantile` of expected error maps to confidence 0.6.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.model_selection import cross_val_predict

LOW_CONFIDENCE = 0.6  # the reference "low confidence" threshold used by the rollout guardrails


class EtaModel(RegressorMixin, BaseEstimator):
    """ETA in hours (`predict`) and a 0..1 confidence (`predict_with_confidence`).

    :param max_iter: boosting iterations of each of the two models.
    :param learning_rate: boosting learning rate.
    :param calibration_quantile: share of training rows expected to keep confidence >= 0.6.
    :param random_state: seed for reproducible training.
    """

    def __init__(
        self, max_iter: int = 200, learning_rate: float = 0.1, calibration_quantile: float = 0.99, random_state: int = 0
    ) -> None:
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.calibration_quantile = calibration_quantile
        self.random_state = random_state

    def _booster(self) -> HistGradientBoostingRegressor:
        return HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=self.learning_rate, random_state=self.random_state
        )

    def fit(self, X: np.ndarray, y: np.ndarray) -> EtaModel:
        """Fit the point model, then the expected-error model on out-of-fold residuals, then calibrate k."""
        out_of_fold = cross_val_predict(self._booster(), X, y, cv=3)
        self.point_ = self._booster().fit(X, y)
        self.spread_ = self._booster().fit(X, np.abs(y - out_of_fold))
        expected_error = np.maximum(self.spread_.predict(X), 0.0)
        self.k_ = -math.log(LOW_CONFIDENCE) / max(float(np.quantile(expected_error, self.calibration_quantile)), 1e-6)
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Point ETA in hours."""
        return self.point_.predict(X)

    def predict_with_confidence(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(eta_prediction, confidence_score) for each row."""
        eta = self.point_.predict(X)
        confidence = np.exp(-self.k_ * np.maximum(self.spread_.predict(X), 0.0))
        return eta, confidence

    def to_onnx(self, input_name: str, outputs: tuple[str, str], opset: dict[str, int]) -> Any:
        """One ONNX graph (unchecked: the exporter checks it) with outputs (prediction, score), float32 [N, 1].

        skl2onnx converts each booster; the two graphs are prefixed and joined on one input, and the confidence
        formula is added as plain ONNX ops.
        """
        from onnx import TensorProto, helper, numpy_helper

        n = int(self.n_features_in_)
        point = _booster_graph(self.point_, input_name, n, opset, "point_")
        spread = _booster_graph(self.spread_, input_name, n, opset, "spread_")
        point_out, spread_out = point.graph.output[0].name, spread.graph.output[0].name
        consts = [
            numpy_helper.from_array(np.array([0.0], dtype=np.float32), "zero"),
            numpy_helper.from_array(np.array([-self.k_], dtype=np.float32), "neg_k"),
        ]
        nodes = [
            helper.make_node("Identity", [input_name], [point.graph.input[0].name]),
            helper.make_node("Identity", [input_name], [spread.graph.input[0].name]),
            *point.graph.node,
            *spread.graph.node,
            helper.make_node("Identity", [point_out], [outputs[0]]),
            helper.make_node("Max", [spread_out, "zero"], ["expected_error"]),
            helper.make_node("Mul", ["expected_error", "neg_k"], ["confidence_logit"]),
            helper.make_node("Exp", ["confidence_logit"], [outputs[1]]),
        ]
        graph = helper.make_graph(
            nodes,
            "eta_model",
            inputs=[helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [None, n])],
            outputs=[helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 1]) for name in outputs],
            initializer=[*point.graph.initializer, *spread.graph.initializer, *consts],
        )
        onx = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(domain, version) for domain, version in opset.items()],
            producer_name="mlrelease",
        )
        onx.ir_version = point.ir_version
        return onx


def _booster_graph(model: Any, input_name: str, n_features: int, opset: dict[str, int], prefix: str) -> Any:
    import onnx.compose
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(model, initial_types=[(input_name, FloatTensorType([None, n_features]))], target_opset=opset)
    return onnx.compose.add_prefix(onx, prefix=prefix)


def fit_eta_model(
    X: np.ndarray,
    y: np.ndarray,
    *,
    random_state: int = 0,
    max_iter: int = 200,
    learning_rate: float = 0.1,
    calibration_quantile: float = 0.99,
) -> EtaModel:
    """The parcel ETA model's training entrypoint (its release spec's `training.entrypoint`): a fitted EtaModel."""
    model = EtaModel(
        max_iter=max_iter,
        learning_rate=learning_rate,
        calibration_quantile=calibration_quantile,
        random_state=random_state,
    )
    return model.fit(X, y)
