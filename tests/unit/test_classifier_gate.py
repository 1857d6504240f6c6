"""The training gate of a binary classifier: log loss, AUC, calibration and positive rate, against the champion."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score

from mlrelease.errors import StepError
from mlrelease.model.classification import classifier_metrics, expected_calibration_error
from mlrelease.model.entrypoint import fit_candidate
from mlrelease.model.gate import judge
from mlrelease.release_spec import ClassificationGates, ReleaseSpec, process_spec

GATES = ClassificationGates()


def _late_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose chance of a late delivery is a known logistic function of two of three features."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    p = 1 / (1 + np.exp(-(-1.0 + 1.5 * X[:, 0] - 1.0 * X[:, 1])))
    return X, (rng.random(n) < p).astype(float)


X_FIT, Y_FIT = _late_rows(6000, 0)
X_HOLD, Y_HOLD = _late_rows(4000, 1)


class Squashed:
    """A classifier whose probabilities are pulled toward their mean: it ranks as well, with the same positive rate,
    but it is under-confident (miscalibrated)."""

    def __init__(self, inner, pull: float) -> None:
        self.inner, self.pull = inner, pull

    def predict_proba(self, X):
        p = self.inner.predict_proba(X)[:, 1]
        p = p.mean() + (p - p.mean()) * (1 - self.pull)
        return np.column_stack([1 - p, p])


def _team_spec(monkeypatch, **gates) -> ReleaseSpec:
    module = types.ModuleType("late_team")

    def fit(X, y, *, random_state, C=1.0):
        return LogisticRegression(C=C, random_state=random_state).fit(X, y)

    def fit_regressor(X, y, *, random_state):
        from sklearn.linear_model import LinearRegression

        return LinearRegression().fit(X, y)

    module.fit, module.fit_regressor = fit, fit_regressor
    monkeypatch.setitem(sys.modules, "late_team", module)
    raw = process_spec().model_dump(mode="json")
    return ReleaseSpec.model_validate(
        {
            **raw,
            "name": "late_delivery",
            "task": "binary_classification",
            "outputs": [{"name": "late_probability", "role": "prediction"}],
            "fallback": {"values": {"late_probability": 0.24}},
            "training": {"entrypoint": "late_team:fit", "params": {}},
            "gates": gates,
        }
    )


def test_the_metrics_match_sklearn_and_a_hand_computed_calibration_error():
    p = np.array([0.1, 0.2, 0.8, 0.9, 0.95, 0.15])
    y = np.array([0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    metrics = classifier_metrics(p, y)
    assert metrics["log_loss"] == pytest.approx(log_loss(y, p))
    assert metrics["auc"] == pytest.approx(roc_auc_score(y, p))
    assert (metrics["positive_rate"], metrics["predicted_positive_rate"]) == pytest.approx((0.5, p.mean()))
    # bins: [0.1, 0.15] mean 0.125 vs 0/2; [0.2] 0.2 vs 1; [0.8] vs 1; [0.9, 0.95] 0.925 vs 1/2
    by_hand = (2 * 0.125 + 1 * 0.8 + 1 * 0.2 + 2 * 0.425) / 6
    assert expected_calibration_error(p, y) == pytest.approx(by_hand)
    assert classifier_metrics(np.array([0.5, 1.2]), np.array([0.0, 1.0]))["invalid_share"] == 0.5
    with pytest.raises(ValueError, match=r"must be 0 or 1; found \[2.0\]"):
        classifier_metrics(np.array([0.5, 0.5]), np.array([0.0, 2.0]))


def test_a_well_fitted_classifier_passes_its_own_gate_and_against_an_equal_champion(monkeypatch):
    spec = _team_spec(monkeypatch)
    candidate = fit_candidate(spec, X_FIT, Y_FIT, seed=0)
    champion = fit_candidate(spec, X_FIT[:3000], Y_FIT[:3000], seed=0)
    judged = judge(spec, spec.gates, candidate, champion, X_HOLD, Y_HOLD, mae_tolerance=0.05)
    assert judged.decision.accepted, judged.decision.reason
    assert judged.metrics["calibration_error"] < 0.03 and judged.metrics["auc"] > 0.75
    assert judged.decision.reason.startswith("holdout log loss ")
    first = judge(spec, spec.gates, candidate, None, X_HOLD, Y_HOLD, mae_tolerance=0.05)
    assert first.decision.accepted and first.decision.reason.startswith("bootstrap: no champion yet")


def test_a_miscalibrated_candidate_is_refused_though_it_ranks_as_well(monkeypatch):
    spec = _team_spec(monkeypatch)
    good = fit_candidate(spec, X_FIT, Y_FIT, seed=0)
    judged = judge(spec, spec.gates, Squashed(good, 0.5), None, X_HOLD, Y_HOLD, mae_tolerance=0.05)
    assert judged.metrics["auc"] == pytest.approx(roc_auc_score(Y_HOLD, good.predict_proba(X_HOLD)[:, 1]))
    assert not judged.decision.accepted
    assert judged.decision.reason.startswith("expected calibration error 0.")
    assert float(judged.decision.reason.split()[3]) > GATES.max_calibration_error


def test_a_candidate_worse_than_the_champion_is_refused_on_log_loss(monkeypatch):
    spec = _team_spec(monkeypatch, max_calibration_error=0.2, max_positive_rate_gap=0.2)
    good = fit_candidate(spec, X_FIT, Y_FIT, seed=0)
    worse = Squashed(good, 0.3)  # still within the loosened calibration bound, but its log loss is higher
    judged = judge(spec, spec.gates, worse, good, X_HOLD, Y_HOLD, mae_tolerance=0.05)
    assert not judged.decision.accepted
    assert "worse than champion" in judged.decision.reason and "2% tolerance" in judged.decision.reason


def test_a_candidate_that_ranks_worse_is_refused_on_auc(monkeypatch):
    spec = _team_spec(monkeypatch, log_loss_tolerance=1.0, max_calibration_error=0.2, max_positive_rate_gap=0.2)
    good = fit_candidate(spec, X_FIT, Y_FIT, seed=0)
    blind = fit_candidate(spec, X_FIT[:, [2, 2, 2]], Y_FIT, seed=0)  # sees only the feature that does not matter

    class OnNoise:
        def predict_proba(self, X):
            return blind.predict_proba(X[:, [2, 2, 2]])

    judged = judge(spec, spec.gates, OnNoise(), good, X_HOLD, Y_HOLD, mae_tolerance=0.05)
    assert not judged.decision.accepted
    assert judged.decision.reason.startswith("holdout AUC ") and judged.decision.reason.endswith("it does not rank")
    assert 0.45 < judged.metrics["auc"] < GATES.min_auc


def test_a_shifted_positive_rate_is_refused(monkeypatch):
    spec = _team_spec(monkeypatch, max_calibration_error=0.5)
    good = fit_candidate(spec, X_FIT, Y_FIT, seed=0)

    class Shifted:
        def predict_proba(self, X):
            p = np.clip(good.predict_proba(X)[:, 1] + 0.05, 0, 1)
            return np.column_stack([1 - p, p])

    decision = judge(spec, spec.gates, Shifted(), None, X_HOLD, Y_HOLD, mae_tolerance=0.05).decision
    assert not decision.accepted and decision.reason.startswith("predicted positive rate")


def test_a_classifier_spec_needs_predict_proba_and_its_own_gates(monkeypatch):
    spec = _team_spec(monkeypatch)
    wrong = spec.model_copy(
        update={"training": spec.training.model_copy(update={"entrypoint": "late_team:fit_regressor"})}
    )
    with pytest.raises(StepError, match=r"returned a LinearRegression, which has no predict_proba\(X\)"):
        fit_candidate(wrong, X_FIT, Y_FIT, seed=0)
    with pytest.raises(ValueError, match="the gates of a binary_classification model: min_confidence_ratio: Extra"):
        _team_spec(monkeypatch, min_confidence_ratio=1.2)
