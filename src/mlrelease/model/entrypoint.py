"""Call a release spec's training entrypoint and check that what it returns can be served as the spec declares."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from mlrelease.errors import StepError
from mlrelease.release_spec import ReleaseSpec, Task

SCORED_METHOD = "predict_with_confidence"  # a regression model with a score output: (prediction, score)
PROBABILITY_METHOD = "predict_proba"  # a binary classifier: [P(0), P(1)] per row, as sklearn's classifiers


def required_method(spec: ReleaseSpec) -> str:
    """The method the platform calls on a fitted model of this spec's task and outputs, with what it returns."""
    if spec.task is Task.BINARY_CLASSIFICATION:
        return f"{PROBABILITY_METHOD}(X) -> [[P(0), P(1)], ...]"
    if spec.score is not None:
        return f"{SCORED_METHOD}(X) -> (prediction, score)"
    return "predict(X) -> prediction"


def fit_candidate(spec: ReleaseSpec, X: np.ndarray, y: np.ndarray, *, seed: int) -> Any:
    """Fit a candidate with the spec's entrypoint and params; a wrong signature or result names the spec's field."""
    function = spec.training_function()
    where = f"{spec.source}: training.entrypoint {spec.training.entrypoint!r}"
    try:  # a misspelt or missing parameter is the spec's mistake: say so before training starts
        inspect.signature(function).bind(X, y, random_state=seed, **spec.training.params)
    except TypeError as exc:
        raise StepError(f"{where} cannot take training.params {dict(spec.training.params)}: {exc}") from None
    except ValueError:  # a builtin or C function without a signature: let the call itself tell
        pass
    model = function(X, y, random_state=seed, **spec.training.params)
    wanted = required_method(spec)
    if not callable(getattr(model, wanted.split("(", 1)[0], None)):
        raise StepError(
            f"{where} returned a {type(model).__name__}, which has no {wanted}: a {spec.task} model with outputs "
            f"{list(spec.output_names)} needs one"
        )
    return model


def model_params(model: Any) -> dict[str, Any]:
    """The fitted model's hyper-parameters (sklearn's get_params) for the run's parameters; empty if it has none."""
    get_params = getattr(model, "get_params", None)
    return dict(get_params(deep=False)) if callable(get_params) else {}
