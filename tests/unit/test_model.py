"""The model's input encoding, its confidence, ONNX parity and the accept/refuse decision."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mlrelease.model.estimator import EtaModel
from mlrelease.model.evaluate import decide, holdout_metrics
from mlrelease.model.features import FEATURES, encode
from mlrelease.model.onnx_export import OUTPUTS, parity, run_onnx, to_onnx


def _synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows where the noise grows with feature 0, so a good confidence must fall as feature 0 grows."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, len(FEATURES))).astype("float32")
    y = 10 + 2 * X[:, 1] + X[:, 2] + rng.normal(0, 0.2 + X[:, 0], n)
    return X, y


@pytest.fixture(scope="module")
def fitted() -> tuple[EtaModel, np.ndarray, np.ndarray]:
    X, y = _synthetic(4000)
    model = EtaModel(max_iter=60).fit(X[:3000], y[:3000])
    return model, X[3000:], y[3000:]


def test_encode_orders_columns_and_maps_unknown_categories():
    row = {name: 1.0 for name in FEATURES} | {"tier": "premium", "category": "spaceship", "region": "islands"}
    frame = pd.DataFrame([row, {**row, "tier": None, "distance_km": None}])
    X = encode(frame)
    assert X.dtype == np.float32 and X.shape == (2, len(FEATURES))
    assert X[0, FEATURES.index("tier")] == 2.0  # standard, plus, premium
    assert X[0, FEATURES.index("category")] == -1.0  # not in the vocabulary
    assert X[1, FEATURES.index("tier")] == -1.0 and np.isnan(X[1, FEATURES.index("distance_km")])
    with pytest.raises(ValueError, match=r"lacks columns \['weight_kg'\]"):
        encode(frame.drop(columns=["weight_kg"]))


def test_low_confidence_goes_with_large_error(fitted):
    model, X, y = fitted
    eta, confidence = model.predict_with_confidence(X)
    metrics = holdout_metrics(eta, confidence, y)
    assert ((confidence > 0) & (confidence <= 1)).all()
    assert metrics["confidence_error_ratio"] > 2.0
    assert metrics["confidence_error_spearman"] < -0.2
    # The noisiest rows (large feature 0) get the lowest confidence.
    assert confidence[X[:, 0] > 8].mean() < confidence[X[:, 0] < 2].mean()


def test_onnx_export_matches_native_and_has_two_named_outputs(fitted):
    import onnx

    model, X, _ = fitted
    model_bytes = to_onnx(model)
    graph = onnx.load_from_string(model_bytes).graph
    assert [o.name for o in graph.output] == list(OUTPUTS)
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim][1] == len(FEATURES)
    check = parity(model, model_bytes, X[:200])
    assert check.ok(1e-3), check
    eta, confidence = run_onnx(model_bytes, X[:5])
    assert eta.shape == (5,) and confidence.shape == (5,)


def test_a_binary_classifier_exports_to_the_specs_outputs_with_parity():
    """Any sklearn binary classifier: P(1) becomes the score output and P(1) >= 0.5 (as 0/1) the prediction output."""
    import onnx
    from sklearn.linear_model import LogisticRegression

    from mlrelease.model.classifiers import fit_gradient_boosting

    X, y = _synthetic(3000, seed=4)
    late = y > np.quantile(y, 0.75)
    for model in (fit_gradient_boosting(X, late, max_iter=40), LogisticRegression(max_iter=500).fit(X, late)):
        model_bytes = to_onnx(model)
        assert [o.name for o in onnx.load_from_string(model_bytes).graph.output] == list(OUTPUTS)
        check = parity(model, model_bytes, X[:500])
        assert check.ok(1e-4) and set(check.max_abs_diff) == set(OUTPUTS), check
        prediction, score = run_onnx(model_bytes, X[:500])
        assert np.allclose(score, model.predict_proba(X[:500])[:, 1], atol=1e-5)
        assert set(np.unique(prediction)) == {0.0, 1.0} and (prediction == (score >= 0.5)).all()


def test_a_model_the_platform_cannot_export_is_named():
    from sklearn.linear_model import LinearRegression, LogisticRegression

    from mlrelease.errors import StepError

    X, y = _synthetic(300)
    with pytest.raises(StepError, match="LinearRegression can be exported neither by itself .* nor as a binary"):
        to_onnx(LinearRegression().fit(X, y))
    three_classes = np.digitize(y, np.quantile(y, [0.33, 0.66]))
    with pytest.raises(StepError, match=r"classes must be \[0, 1\] \(P\(1\) is the score\), got \[0, 1, 2\]"):
        to_onnx(LogisticRegression(max_iter=300).fit(X, three_classes))


def test_holdout_metrics_values():
    m = holdout_metrics(
        np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0.9, 0.9, 0.9, 0.9, 0.1]), np.array([1.0, 2.0, 3.0, 4.0, 15.0])
    )
    assert m["mae"] == pytest.approx(2.0) and m["low_confidence_share"] == pytest.approx(0.2)
    assert m["confidence_error_ratio"] == float("inf")
    assert holdout_metrics(np.array([np.nan, 1.0]), np.array([0.5, 0.5]), np.array([1.0, 1.0]))["nan_share"] == 0.5


def _m(mae: float, ratio: float = 2.0, nan: float = 0.0) -> dict[str, float]:
    return {"mae": mae, "confidence_error_ratio": ratio, "nan_share": nan}


@pytest.mark.parametrize(
    ("candidate", "champion", "accepted", "reason"),
    [
        (_m(2.0), None, True, "bootstrap: no champion yet"),
        (_m(2.09), _m(2.0), True, "vs champion 2.000 h"),
        (_m(2.2), _m(2.0), False, "worse than champion 2.000 h beyond the 5% tolerance (limit 2.100 h)"),
        (_m(1.0, nan=0.01), _m(2.0), False, "NaN/inf on 1.0%"),
        (_m(1.0, ratio=1.0), _m(2.0), False, "confidence does not track error"),
    ],
)
def test_decide(candidate, champion, accepted, reason):
    decision = decide(candidate, champion, mae_tolerance=0.05, min_confidence_ratio=1.2)
    assert decision.accepted is accepted and reason in decision.reason
