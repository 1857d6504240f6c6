"""One arm's traffic in one cohort over a judged window, summed per user: what every contract reads (pure numpy).

The user is the unit of analysis: assignment to an arm is sticky per user, so the contracts' variances are
clustered by user (`mlrelease.verdicts.sequential.clustered_ratio`) and need, per user, the sums below rather than
every call. The same summary is built from a gateway decision log (`DecisionLogSource`) and from simulated traffic
(`bench/bench_verdict_sim.py`), so both drive the very same statistics.

A call belongs to the arm its user was *assigned* to, whoever answered it: a candidate-assigned request that failed
and was retried on stable is one candidate request that failed (the retry itself is not a second request). Sampled
records carry weights (1 / sample rate), so every sum is an unbiased estimate of the unsampled one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# The vocabulary of a model call (outcome codes, latency bounds, the low-confidence threshold) lives with the
# statistics, below the gateway that records calls by it; it is re-exported here, where the contracts read it.
from mlrelease.verdicts.calls import (
    ERROR,
    HARD_FAILURES,
    LATENCY_BOUNDS_S,
    LOW_CONFIDENCE,
    NAN,
    OK,
    OUT_OF_RANGE,
    OUTCOME_CODES,
    SERVING_FAILURES,
    TIMEOUT,
    UNAVAILABLE,
)

__all__ = [
    "ERROR",
    "HARD_FAILURES",
    "LATENCY_BOUNDS_S",
    "LOW_CONFIDENCE",
    "NAN",
    "OK",
    "OUTCOME_CODES",
    "OUT_OF_RANGE",
    "SERVING_FAILURES",
    "TIMEOUT",
    "UNAVAILABLE",
    "CohortWindow",
    "EMPTY",
    "by_unit",
    "dense",
    "on_units",
    "pooled",
    "summarize_calls",
]

_SUMS = ("calls", "failed", "nan", "log_latency", "answers", "low_confidence", "log_eta", "log_confidence")


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class CohortWindow:
    """Per-user sums of one arm's requests in a cohort (arrays aligned with `units`, one entry per user).

    `calls` are requests (weighted); `failed` hard failures; `nan` NaN/inf answers; `log_latency` the summed log of
    each request's model-call latency; `slow[:, i]` the requests slower than `LATENCY_BOUNDS_S[i]`. The answer sums
    count each distinct request (same key) once: `answers`, those below `LOW_CONFIDENCE`, and their log ETA and
    log confidence.
    """

    units: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    calls: np.ndarray = field(default_factory=_empty)
    failed: np.ndarray = field(default_factory=_empty)
    nan: np.ndarray = field(default_factory=_empty)
    log_latency: np.ndarray = field(default_factory=_empty)
    answers: np.ndarray = field(default_factory=_empty)
    low_confidence: np.ndarray = field(default_factory=_empty)
    log_eta: np.ndarray = field(default_factory=_empty)
    log_confidence: np.ndarray = field(default_factory=_empty)
    slow: np.ndarray = field(default_factory=lambda: np.zeros((0, len(LATENCY_BOUNDS_S))))

    @property
    def requests(self) -> int:
        """Requests in the window (weighted, rounded)."""
        return int(round(float(self.calls.sum())))

    @property
    def users(self) -> int:
        """Users with at least one request."""
        return int((self.calls > 0).sum())

    def total(self, name: str) -> float:
        """The window's total of one per-user sum (e.g. 'failed')."""
        return float(getattr(self, name).sum())

    def merged(self, other: CohortWindow) -> CohortWindow:
        """Both windows as one, users present in both summed (adding time slices)."""
        return pooled((self, other))

    def minus(self, other: CohortWindow) -> CohortWindow:
        """This window without `other`'s requests (`other` must be part of it: an outage slice cut out)."""
        if not len(other.units):
            return self
        return _combine([(self, 1.0), (other, -1.0)])


EMPTY = CohortWindow()


def pooled(windows: Sequence[CohortWindow]) -> CohortWindow:
    """The windows as one, users present in several summed (pooling cohorts): one pass, however many there are."""
    present = [w for w in windows if len(w.units)]
    if not present:
        return EMPTY
    if len(present) == 1:
        return present[0]
    return _combine([(w, 1.0) for w in present])


def _combine(parts: list[tuple[CohortWindow, float]]) -> CohortWindow:
    """Σ sign · window over `parts`, user by user (the first part's sign is +1)."""
    first = parts[0][0]
    if all(len(w.units) == len(first.units) and np.array_equal(w.units, first.units) for w, _ in parts[1:]):
        # the same users in the same order (a dense per-user layout): add the sums as they are, into one new array
        sums = {}
        for name in (*_SUMS, "slow"):
            arrays = [getattr(w, name) for w, _ in parts]
            # the first two into a new array in one pass, wide enough for every part; the rest added in place
            wide = np.result_type(*arrays)
            first_two = np.add if parts[1][1] > 0 else np.subtract
            total = first_two(arrays[0], arrays[1], dtype=wide)
            for array, (_, sign) in zip(arrays[2:], parts[2:], strict=True):
                if sign > 0:
                    total += array
                else:
                    total -= array
            sums[name] = total
        return CohortWindow(first.units, **sums)
    ids, where = np.unique(np.concatenate([w.units for w, _ in parts]), return_inverse=True)
    n = len(ids)

    def add(name: str) -> np.ndarray:
        return np.bincount(where, weights=np.concatenate([sign * getattr(w, name) for w, sign in parts]), minlength=n)

    sums = {name: add(name) for name in _SUMS}
    bounds = len(LATENCY_BOUNDS_S)
    cells = (where[:, None] * bounds + np.arange(bounds)[None, :]).ravel()
    stacked = np.concatenate([sign * w.slow for w, sign in parts]).ravel()
    slow = np.bincount(cells, weights=stacked, minlength=n * bounds).reshape(n, bounds)
    keep = np.abs(sums["calls"]) > 1e-9
    return CohortWindow(ids[keep], **{k: v[keep] for k, v in sums.items()}, slow=slow[keep])


def on_units(ids: np.ndarray, values: np.ndarray, units: np.ndarray) -> np.ndarray:
    """`values` (one per user of `ids`) laid out on `units`, in their order, zero for a user `ids` does not hold: a
    pre-rollout sum beside an arm's window, user by user (only the arrays a contract reads, not the whole window)."""
    units = np.asarray(units, dtype=np.int64)
    if len(ids) == len(units) and np.array_equal(ids, units):
        return values
    out = np.zeros(len(units))
    if not len(ids):
        return out
    order = np.argsort(ids, kind="stable")
    at = np.clip(np.searchsorted(ids[order], units), 0, len(ids) - 1)
    found = ids[order][at] == units
    out[found] = values[order[at[found]]]
    return out


def by_unit(window: CohortWindow, unit: np.ndarray) -> CohortWindow:
    """The window's users summed into analysis units (`unit`: each of `window.units`' unit): what a reader of the
    gateway's per-unit Prometheus series (rollout/prometheus_source.py) sees."""
    if not len(window.units):
        return window
    ids, where = np.unique(np.asarray(unit, dtype=np.int64), return_inverse=True)
    n, bounds = len(ids), len(LATENCY_BOUNDS_S)
    sums = {name: np.bincount(where, weights=getattr(window, name), minlength=n) for name in _SUMS}
    cells = (where[:, None] * bounds + np.arange(bounds)[None, :]).ravel()
    slow = np.bincount(cells, weights=window.slow.ravel(), minlength=n * bounds).reshape(n, bounds)
    return CohortWindow(ids, **sums, slow=slow)


def dense(window: CohortWindow, users: int) -> CohortWindow:
    """The window laid out over users 0 … users − 1 (ids are indices), so that adding two is adding arrays."""
    sums = {}
    for name in _SUMS:
        values = np.zeros(users)
        values[window.units] = getattr(window, name)
        sums[name] = values
    slow = np.zeros((users, len(LATENCY_BOUNDS_S)))
    slow[window.units] = window.slow
    return CohortWindow(np.arange(users, dtype=np.int64), **sums, slow=slow)


def summarize_calls(
    unit: np.ndarray,
    outcome: np.ndarray,
    latency_s: np.ndarray,
    *,
    weight: np.ndarray | None = None,
    retry: np.ndarray | None = None,
    key: np.ndarray | None = None,
    eta: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
) -> CohortWindow:
    """Per-user sums of one arm's calls (parallel arrays: one entry per model call, oldest first).

    A retry (the stable call answering a candidate-assigned request that failed) is not a request of its own and is
    left out. Answers are counted once per distinct `key` (the first answer); without keys every answer counts.
    """
    unit = np.asarray(unit, dtype=np.int64)
    outcome = np.asarray(outcome, dtype=np.int64)
    latency = np.asarray(latency_s, dtype=np.float64)
    w = np.ones(len(unit)) if weight is None else np.asarray(weight, dtype=np.float64)
    keep = np.ones(len(unit), dtype=bool) if retry is None else ~np.asarray(retry, dtype=bool)
    unit, outcome, latency, w = unit[keep], outcome[keep], latency[keep], w[keep]
    if not len(unit):
        return EMPTY
    ids, where = np.unique(unit, return_inverse=True)
    n = len(ids)

    def per_user(values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        index = where if rows is None else where[rows]
        return np.bincount(index, weights=values, minlength=n)

    log_latency = np.log(np.clip(latency, 1e-6, None))
    slow = _slow_per_user(where, n, latency, w)
    answered = np.flatnonzero(outcome == OK)
    if key is not None and len(answered):
        keys = np.asarray(key)[keep][answered]
        _, first = np.unique(keys, return_index=True)
        answered = answered[np.sort(first)]
    eta_a = np.asarray(eta, dtype=np.float64)[keep][answered] if eta is not None else np.ones(len(answered))
    conf_a = (
        np.asarray(confidence, dtype=np.float64)[keep][answered] if confidence is not None else np.ones(len(answered))
    )
    w_a = w[answered]
    return CohortWindow(
        units=ids,
        calls=per_user(w),
        failed=per_user(w * np.isin(outcome, HARD_FAILURES)),
        nan=per_user(w * (outcome == NAN)),
        log_latency=per_user(w * log_latency),
        answers=per_user(w_a, answered),
        low_confidence=per_user(w_a * (conf_a < LOW_CONFIDENCE), answered),
        log_eta=per_user(w_a * np.log(np.clip(eta_a, 1e-6, None)), answered),
        log_confidence=per_user(w_a * np.log(np.clip(conf_a, 1e-6, None)), answered),
        slow=slow,
    )


def _slow_per_user(where: np.ndarray, n: int, latency: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per user, the weighted requests slower than each bound: a histogram of bound positions, summed from the top."""
    bounds = len(LATENCY_BOUNDS_S)
    above = np.searchsorted(LATENCY_BOUNDS_S, latency, side="left")  # bounds strictly below the latency
    histogram = np.bincount(where * (bounds + 1) + above, weights=w, minlength=n * (bounds + 1)).reshape(n, bounds + 1)
    # a request with `above` = k is slower than bounds 0..k-1: count it for every bound below its position
    return np.cumsum(histogram[:, ::-1], axis=1)[:, ::-1][:, 1:]
