"""Holdout metrics of a binary classifier's probability and its accept/refuse decision (pure functions).

A candidate must be calibrated on its own (expected calibration error, and the predicted positive rate
against the observed one) and, once there is a champion, not worse than it on the same holdout beyond the
spec's tolerances: log loss (relative) and ranking (AUC, absolute).
"""

from __future__ import annotations

import numpy as np

from mlrelease.model.evaluate import Decision
from mlrelease.release_spec import ClassificationGates

CALIBRATION_BINS = 10  # equal-width probability bins of the expected calibration error
PROBABILITY_FLOOR = 1e-15  # log loss clips probabilities here, as sklearn's does


def expected_calibration_error(probability: np.ndarray, actual: np.ndarray, bins: int = CALIBRATION_BINS) -> float:
    """Row-weighted mean |mean probability - positive share| over equal-width probability bins."""
    index = np.minimum((probability * bins).astype(int), bins - 1)
    total = 0.0
    for b in np.unique(index):
        members = index == b
        total += members.sum() * abs(float(probability[members].mean()) - float(actual[members].mean()))
    return total / len(probability)


def classifier_metrics(probability: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """Log loss, AUC, calibration error, predicted and observed positive rates, and the share of unusable outputs."""
    from sklearn.metrics import log_loss, roc_auc_score

    p = np.asarray(probability, dtype="float64").reshape(-1)
    y = np.asarray(actual, dtype="float64").reshape(-1)
    if not np.isin(y, (0.0, 1.0)).all():
        stray = [float(v) for v in np.unique(y) if v not in (0.0, 1.0)]
        raise ValueError(f"a binary label must be 0 or 1; found {stray[:5]}")
    unusable = ~np.isfinite(p) | (p < 0) | (p > 1)
    metrics = {"invalid_share": float(unusable.mean()), "positive_rate": float(y.mean())}
    if unusable.any():
        return metrics
    metrics["predicted_positive_rate"] = float(p.mean())
    metrics["log_loss"] = float(log_loss(y, np.clip(p, PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR), labels=[0, 1]))
    metrics["auc"] = float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else float("nan")
    metrics["calibration_error"] = expected_calibration_error(p, y)
    return metrics


def decide_classifier(
    candidate: dict[str, float], champion: dict[str, float] | None, limits: ClassificationGates
) -> Decision:
    """Refuse invalid probabilities, a miscalibrated candidate, or one worse than the champion beyond tolerance."""
    if candidate["invalid_share"] > 0:
        return Decision(
            False, f"candidate's probability is NaN/inf or outside [0, 1] on {candidate['invalid_share']:.1%} of rows"
        )
    gap = abs(candidate["predicted_positive_rate"] - candidate["positive_rate"])
    if gap > limits.max_positive_rate_gap:
        return Decision(
            False,
            f"predicted positive rate {candidate['predicted_positive_rate']:.3f} vs observed "
            f"{candidate['positive_rate']:.3f}: gap {gap:.3f} > {limits.max_positive_rate_gap}",
        )
    if candidate["calibration_error"] > limits.max_calibration_error:
        return Decision(
            False,
            f"expected calibration error {candidate['calibration_error']:.3f} > {limits.max_calibration_error}",
        )
    if not candidate["auc"] >= limits.min_auc:  # NaN (one class only in the holdout) is refused too
        return Decision(False, f"holdout AUC {candidate['auc']:.3f} < {limits.min_auc}: it does not rank")
    summary = f"log loss {candidate['log_loss']:.4f}, AUC {candidate['auc']:.3f}"
    if champion is None:
        return Decision(True, f"bootstrap: no champion yet; holdout {summary}")
    loss_limit = champion["log_loss"] * (1 + limits.log_loss_tolerance)
    if candidate["log_loss"] > loss_limit:
        return Decision(
            False,
            f"holdout log loss {candidate['log_loss']:.4f} is worse than champion {champion['log_loss']:.4f} "
            f"beyond the {limits.log_loss_tolerance:.0%} tolerance (limit {loss_limit:.4f})",
        )
    auc_floor = champion["auc"] - limits.auc_tolerance
    if candidate["auc"] < auc_floor:
        return Decision(
            False,
            f"holdout AUC {candidate['auc']:.3f} is below champion {champion['auc']:.3f} "
            f"beyond the {limits.auc_tolerance} tolerance (floor {auc_floor:.3f})",
        )
    return Decision(
        True, f"holdout {summary} vs champion log loss {champion['log_loss']:.4f}, AUC {champion['auc']:.3f}"
    )
