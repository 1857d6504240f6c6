"""Call a release spec's training entrypoint and check that what it returns can be served as the spec declares."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from mlrelease.errors import StepError
from mlrelease.release_spec import ReleaseSpec

# What the platform calls on a fitted model whose spec declares a prediction and a score output.
SCORED_METHOD = "predict_with_confidence"


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
    if spec.score is not None and not callable(getattr(model, SCORED_METHOD, None)):
        raise StepError(
            f"{where} returned a {type(model).__name__}, which has no {SCORED_METHOD}(X) -> (prediction, score): "
            f"the spec's outputs {list(spec.output_names)} need one"
        )
    return model


def model_params(model: Any) -> dict[str, Any]:
    """The fitted model's hyper-parameters (sklearn's get_params) for the run's parameters; empty if it has none."""
    get_params = getattr(model, "get_params", None)
    return dict(get_params(deep=False)) if callable(get_params) else {}
