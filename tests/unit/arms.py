"""Test helper: one arm's window from per-call numbers, built by the product's own `summarize_calls`."""

from __future__ import annotations

import numpy as np

from mlrelease.rollout.windows import ERROR, NAN, OK, CohortWindow, summarize_calls


def arm_window(
    n: int,
    *,
    errors: int = 0,
    nan: int = 0,
    low: int = 0,
    latency: float = 0.002,
    eta: float = 20.0,
    users: int | None = None,
    rng: np.random.Generator,
    latencies: np.ndarray | None = None,
    confidences: np.ndarray | None = None,
    keys: np.ndarray | None = None,
) -> CohortWindow:
    """`n` requests from `users` users (default: each its own user): `errors` failed, `nan` answered NaN, `low` of the
    answered ones with confidence 0.3 (the rest 0.9); log-normal latencies and ETAs around the given ones."""
    outcome = np.array([ERROR] * errors + [NAN] * nan + [OK] * (n - errors - nan))
    answered = outcome == OK
    confidence = np.full(n, np.nan)
    confidence[answered] = [0.3] * low + [0.9] * (int(answered.sum()) - low)
    if confidences is not None:
        confidence[answered] = confidences
    eta_values = np.where(answered, rng.lognormal(np.log(eta), 0.3, n), np.nan)
    unit = np.arange(n) if users is None else np.arange(n) % users
    return summarize_calls(
        unit,
        outcome,
        rng.lognormal(np.log(latency), 0.3, n) if latencies is None else latencies,
        key=np.arange(n) if keys is None else keys,
        eta=eta_values,
        confidence=confidence,
    )
