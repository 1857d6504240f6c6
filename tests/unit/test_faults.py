"""Deliberately faulty model versions: the same ONNX graph, broken in exactly the named way."""

from __future__ import annotations

import numpy as np
import pytest

from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import run_onnx, to_onnx
from mlrelease.serving.faults import FAULT_KINDS, faulty_model

REMOTE = FEATURES.index("is_remote")
BULKY = FEATURES.index("is_bulky")


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, np.ndarray]:
    """A tiny model's ONNX bytes and 300 rows whose 0/1 columns are mixed."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 10, size=(300, len(FEATURES))).astype("float32")
    X[:, REMOTE] = rng.integers(0, 2, size=300)
    X[:, BULKY] = rng.integers(0, 2, size=300)
    y = 10 + 2 * X[:, 1] + 5 * X[:, REMOTE] + rng.normal(0, 1, 300)
    model = EtaModel(max_iter=10).fit(X, y)
    return to_onnx(model), X


def test_baseline_is_finite(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    assert eta.shape == confidence.shape == (len(X),)
    assert np.isfinite(eta).all() and np.isfinite(confidence).all()


def test_nan_everywhere_keeps_confidence(sample):
    model_bytes, X = sample
    _, confidence = run_onnx(model_bytes, X)
    broken = faulty_model(model_bytes, "nan")
    assert broken != model_bytes
    eta_f, confidence_f = run_onnx(broken, X)
    assert eta_f.shape == (len(X),)
    assert np.isnan(eta_f).all()
    np.testing.assert_array_equal(confidence_f, confidence)


def test_nan_only_where_remote(sample):
    model_bytes, X = sample
    eta, confidence = run_onnx(model_bytes, X)
    eta_f, confidence_f = run_onnx(faulty_model(model_bytes, "nan", only_where="is_remote"), X)
    remote = X[:, REMOTE] == 1
    assert 0 < remote.sum() < len(X)  # both kinds of rows are present
    np.testing.assert_array_equal(np.isnan(eta_f), remote)
    np.testing.assert_array_equal(eta_f[~remote], eta[~remote])  # the other rows are untouched
    np.testing.assert_array_equal(confidence_f, confidence)


def test_nan_only_where_follows_the_named_column(sample):
    model_bytes, X = sample
    eta_f, _ = run_onnx(faulty_model(model_bytes, "nan", only_where="is_bulky"), X)
    np.testing.assert_array_equal(np.isnan(eta_f), X[:, BULKY] == 1)
    assert not np.array_equal(X[:, BULKY], X[:, REMOTE])  # so the test tells the two columns apart


def test_error_fault_fails_at_inference(sample):
    model_bytes, X = sample
    broken = faulty_model(model_bytes, "error")
    with pytest.raises(Exception, match=r"(?i)(dimension|shape|invalid)"):
        run_onnx(broken, X[:5])
    # the graph now wants one more column than the model's features; given it, the answers are unchanged
    wider = np.hstack([X[:5], np.zeros((5, 1), dtype=np.float32)])
    eta_w, confidence_w = run_onnx(broken, wider)
    eta, confidence = run_onnx(model_bytes, X[:5])
    np.testing.assert_array_equal(eta_w, eta)
    np.testing.assert_array_equal(confidence_w, confidence)


def test_unknown_kind_is_refused(sample):
    model_bytes, _ = sample
    assert FAULT_KINDS == ("nan", "error")
    with pytest.raises(ValueError, match=r"unknown fault kind 'slow'"):
        faulty_model(model_bytes, "slow")


def test_unknown_feature_is_refused(sample):
    model_bytes, _ = sample
    with pytest.raises(ValueError, match=r"only_where must be a model feature, got 'shoe_size'"):
        faulty_model(model_bytes, "nan", only_where="shoe_size")
