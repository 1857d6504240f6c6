"""Holdout metrics for an ETA model and the accept/refuse decision against the champion (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from mlrelease.model.estimator import LOW_CONFIDENCE


def holdout_metrics(eta: np.ndarray, confidence: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """MAE, P90 absolute error, low-confidence share, and how well confidence tracks error.

    `confidence_error_ratio` is the mean absolute error of the least-confident fifth of rows over that
    of the most-confident fifth: above 1 means low confidence really does go with large error.
    """
    error = np.abs(np.asarray(eta, dtype="float64") - np.asarray(actual, dtype="float64"))
    conf = np.asarray(confidence, dtype="float64")
    order = np.argsort(conf, kind="stable")
    fifth = max(1, len(order) // 5)
    low, high = error[order[:fifth]].mean(), error[order[-fifth:]].mean()
    rho = spearmanr(conf, error).statistic if np.ptp(conf) > 0 else 0.0
    return {
        "mae": float(error.mean()),
        "p90_abs_error": float(np.quantile(error, 0.9)),
        "low_confidence_share": float((conf < LOW_CONFIDENCE).mean()),
        "confidence_error_ratio": float(low / high) if high > 0 else float("inf"),
        "confidence_error_spearman": float(rho),
        "nan_share": float(np.mean(~np.isfinite(eta) | ~np.isfinite(conf))),
    }


@dataclass(frozen=True)
class Decision:
    """Whether the candidate may become challenger, and why."""

    accepted: bool
    reason: str


def decide(
    candidate: dict[str, float], champion: dict[str, float] | None, *, mae_tolerance: float, min_confidence_ratio: float
) -> Decision:
    """Refuse a candidate that emits NaN, whose confidence does not track error, or that is worse than the champion."""
    if candidate["nan_share"] > 0:
        return Decision(False, f"candidate emits NaN/inf on {candidate['nan_share']:.1%} of the holdout")
    if candidate["confidence_error_ratio"] < min_confidence_ratio:
        return Decision(
            False,
            f"confidence does not track error: least/most confident error ratio "
            f"{candidate['confidence_error_ratio']:.2f} < {min_confidence_ratio}",
        )
    if champion is None:
        return Decision(True, f"bootstrap: no champion yet; holdout MAE {candidate['mae']:.3f} h")
    limit = champion["mae"] * (1 + mae_tolerance)
    if candidate["mae"] > limit:
        return Decision(
            False,
            f"holdout MAE {candidate['mae']:.3f} h is worse than champion {champion['mae']:.3f} h "
            f"beyond the {mae_tolerance:.0%} tolerance (limit {limit:.3f} h)",
        )
    return Decision(
        True, f"holdout MAE {candidate['mae']:.3f} h vs champion {champion['mae']:.3f} h (limit {limit:.3f} h)"
    )


def prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Metric names with a prefix, for logging champion numbers beside the candidate's."""
    return {f"{prefix}{k}": v for k, v in metrics.items()}
