"""The training gate: the candidate's and the champion's holdout metrics for the spec's task, and the decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlrelease.model.classification import classifier_metrics, decide_classifier
from mlrelease.model.entrypoint import PROBABILITY_METHOD
from mlrelease.model.evaluate import Decision, decide, holdout_metrics
from mlrelease.release_spec import ClassificationGates, RegressionGates, ReleaseSpec, Task


@dataclass(frozen=True)
class Judgement:
    """What the gate measured on the holdout and what it decided."""

    metrics: dict[str, float]
    champion_metrics: dict[str, float] | None
    decision: Decision


def positive_probability(model: Any, X: np.ndarray) -> np.ndarray:
    """P(positive) per row from a binary classifier's predict_proba (its second column)."""
    proba = np.asarray(getattr(model, PROBABILITY_METHOD)(X))
    if proba.ndim != 2 or proba.shape[1] != 2:
        raise ValueError(f"{PROBABILITY_METHOD} returned shape {proba.shape}; a binary classifier returns (rows, 2)")
    return proba[:, 1]


def holdout(spec: ReleaseSpec, model: Any, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """The task's holdout metrics of one model."""
    if spec.task is Task.BINARY_CLASSIFICATION:
        return classifier_metrics(positive_probability(model, X), y)
    prediction, score = model.predict_with_confidence(X)
    return holdout_metrics(prediction, score, y)


def judge(
    spec: ReleaseSpec,
    gates: RegressionGates | ClassificationGates,
    candidate: Any,
    champion: Any | None,
    X: np.ndarray,
    y: np.ndarray,
    *,
    mae_tolerance: float,
) -> Judgement:
    """Measure the candidate (and the champion, on the same rows) and decide by the task's gates."""
    metrics = holdout(spec, candidate, X, y)
    champion_metrics = holdout(spec, champion, X, y) if champion is not None else None
    if isinstance(gates, ClassificationGates):
        decision = decide_classifier(metrics, champion_metrics, gates)
    else:
        decision = decide(
            metrics, champion_metrics, mae_tolerance=mae_tolerance, min_confidence_ratio=gates.min_confidence_ratio
        )
    return Judgement(metrics, champion_metrics, decision)
