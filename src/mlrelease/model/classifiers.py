"""Training entrypoints for binary classifiers (a release spec's `training.entrypoint`)."""

from __future__ import annotations

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier


def fit_gradient_boosting(
    X: np.ndarray,
    y: np.ndarray,
    *,
    random_state: int = 0,
    max_iter: int = 100,
    learning_rate: float = 0.1,
    min_samples_leaf: int = 20,
    l2_regularization: float = 0.0,
) -> HistGradientBoostingClassifier:
    """A fitted gradient-boosted classifier of a 0/1 (or boolean) label; its predict_proba is the served score."""
    model = HistGradientBoostingClassifier(
        max_iter=max_iter,
        learning_rate=learning_rate,
        min_samples_leaf=min_samples_leaf,
        l2_regularization=l2_regularization,
        random_state=random_state,
    )
    # An integer label: the classes are then [0, 1], the order the exported graph's probability column assumes.
    return model.fit(X, np.asarray(y).astype(np.int64))
