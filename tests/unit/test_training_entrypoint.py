"""A release spec's training entrypoint: the platform calls the model team's function, and names the spec when wrong."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from mlrelease.errors import StepError
from mlrelease.model.entrypoint import fit_candidate, model_params
from mlrelease.model.estimator import EtaModel
from mlrelease.release_spec import ReleaseSpec, process_spec

ROWS = np.random.default_rng(0).random((400, 3))
LABEL = 5 + 3 * ROWS[:, 0] + np.random.default_rng(1).normal(0, 0.1, 400)


class ScoredLinear(LinearRegression):
    """A stand-in for a team's own model: a linear fit that also says how sure it is."""

    def predict_with_confidence(self, X):
        return self.predict(X), np.full(len(X), 0.9)


@pytest.fixture
def team_module(monkeypatch) -> types.ModuleType:
    """An importable module `team_models` with a few entrypoints, as a model team would install it."""
    module = types.ModuleType("team_models")
    calls: list[dict] = []

    def fit_scored(X, y, *, random_state, fit_intercept=True):
        calls.append({"rows": len(X), "random_state": random_state, "fit_intercept": fit_intercept})
        return ScoredLinear(fit_intercept=fit_intercept).fit(X, y)

    def fit_plain(X, y, *, random_state):
        return LinearRegression().fit(X, y)

    module.fit_scored, module.fit_plain, module.calls, module.not_a_function = fit_scored, fit_plain, calls, 3
    monkeypatch.setitem(sys.modules, "team_models", module)
    return module


def _spec(**training) -> ReleaseSpec:
    raw = process_spec().model_dump(mode="json")
    return ReleaseSpec.model_validate({**raw, "training": {**raw["training"], **training}})


def test_the_parcel_spec_trains_its_own_estimator_through_its_entrypoint():
    spec = _spec(params={"max_iter": 5})
    model = fit_candidate(spec, ROWS, LABEL, seed=7)
    assert isinstance(model, EtaModel) and (model.max_iter, model.random_state) == (5, 7)
    assert model_params(model)["max_iter"] == 5


def test_another_entrypoint_is_called_with_the_rows_seed_and_params(team_module):
    spec = _spec(entrypoint="team_models:fit_scored", params={"fit_intercept": False})
    model = fit_candidate(spec, ROWS, LABEL, seed=11)
    assert isinstance(model, ScoredLinear) and model.fit_intercept is False
    assert team_module.calls == [{"rows": 400, "random_state": 11, "fit_intercept": False}]
    assert model_params(model)["fit_intercept"] is False


@pytest.mark.parametrize(
    ("entrypoint", "params", "complaint"),
    [
        ("no_such_team_pkg.models:fit", {}, "module no_such_team_pkg.models cannot be imported: No module named"),
        ("team_models:fit_missing", {}, "module team_models has no fit_missing"),
        ("team_models:not_a_function", {}, "not_a_function is a int, not a function"),
        ("team_models:fit_scored", {"fit_intercpt": True}, "cannot take training.params {'fit_intercpt': True}"),
        (
            "team_models:fit_plain",
            {},
            "returned a LinearRegression, which has no predict_with_confidence(X) -> (prediction, score): a regression",
        ),
    ],
)
def test_a_wrong_entrypoint_is_named_with_the_spec_and_the_field(team_module, entrypoint, params, complaint):
    spec = _spec(entrypoint=entrypoint, params=params)
    with pytest.raises(StepError) as refused:
        fit_candidate(spec, ROWS, LABEL, seed=0)
    message = str(refused.value)
    assert message.startswith(f"release spec of parcel_eta: training.entrypoint {entrypoint!r}")
    assert complaint in message and "\n" not in message
    assert team_module.calls == []  # nothing was trained with a spec that does not fit


@pytest.mark.parametrize("entrypoint", ["fit_eta_model", "mlrelease.model.estimator", "a-b:c", "pkg.:f", "m:f:g"])
def test_an_entrypoint_that_is_not_module_colon_function_is_refused_at_load(entrypoint):
    with pytest.raises(ValueError, match=r"training\.entrypoint\n  String should match pattern"):
        _spec(entrypoint=entrypoint)
