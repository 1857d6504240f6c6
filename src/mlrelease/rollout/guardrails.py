"""Guardrail verdicts: each contract of the plan judged on the candidate and its concurrent control (pure).

A guardrail compares the candidate's calls with stable's calls *of the same cohort in the same window*
(the control slice), through an anytime-valid confidence sequence (`mlrelease.verdicts.sequential`), and
decides fail / pass / continue against its tolerance (`mlrelease.verdicts.decide`). Verdicts are ordered
pass < continue < inconclusive < fail, and that order is data (`SEVERITY`), so combining many verdicts is
taking the worst one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mlrelease.rollout.plan import RELATIVE, Guardrail
from mlrelease.verdicts.decide import ON_INCONCLUSIVE, SEVERITY, Verdict, decide, worst
from mlrelease.verdicts.sequential import Band, mean_difference, proportion_difference, proportion_level

__all__ = ["SEVERITY", "CohortWindow", "GuardrailResult", "Verdict", "evaluate", "worst"]


@dataclass(frozen=True)
class CohortWindow:
    """One version's calls in one cohort over the judged window: counts, and the raw latencies and answers."""

    requests: int
    errors: int
    nan: int
    low_confidence: int
    latencies_s: Sequence[float] = ()
    predictions: Sequence[float] = ()
    confidences: Sequence[float] = ()  # parallel to `predictions`
    keys: Sequence[int] = ()  # parallel to `predictions`: the request's identity (same inputs, same key)

    def merged(self, other: CohortWindow) -> CohortWindow:
        """Both windows as one (pooling cohorts)."""
        return CohortWindow(
            self.requests + other.requests,
            self.errors + other.errors,
            self.nan + other.nan,
            self.low_confidence + other.low_confidence,
            (*self.latencies_s, *other.latencies_s),
            (*self.predictions, *other.predictions),
            (*self.confidences, *other.confidences),
            (*self.keys, *other.keys),
        )

    def distinct_answers(self) -> tuple[np.ndarray, np.ndarray]:
        """The answers (eta, confidence) with repeats of the same request counted once.

        A version answers the same request with the same numbers, and the control slice holds other users
        than the candidate's: when traffic repeats requests (a replayed pool, a user's retries), counting
        every repeat would treat one order seen fifty times as fifty independent observations, and a band
        would shrink around a difference between the two arms' *requests*, not their models. The unit of
        the answer-based contracts is the distinct request (by `keys`; without keys every answer counts);
        in production traffic, where orders are unique, this changes nothing.
        """
        eta = np.asarray(self.predictions, dtype=np.float64)
        confidence = (
            np.asarray(self.confidences, dtype=np.float64) if len(self.confidences) == len(eta) else np.ones(len(eta))
        )
        if len(self.keys) != len(eta) or not len(eta):
            return eta, confidence
        _, first = np.unique(np.asarray(self.keys), return_index=True)
        return eta[first], confidence[first]

    def quantile_latency_s(self, q: float) -> float:
        """A latency quantile of the window (0 when it has no calls)."""
        return float(np.quantile(self.latencies_s, q)) if len(self.latencies_s) else 0.0


EMPTY = CohortWindow(requests=0, errors=0, nan=0, low_confidence=0)


@dataclass(frozen=True)
class GuardrailResult:
    """A guardrail's verdict with the evidence behind it (what the record, the report and an alert quote)."""

    cohort: str
    metric: str
    verdict: Verdict
    candidate: float | None  # the candidate's value (a share, or a median in seconds / hours)
    stable: float | None  # the control's value, None when judged against a fixed limit
    threshold: float  # the tolerance (or the limit), on the scale of `band`
    reason: str
    band: dict[str, float | int] = field(default_factory=dict)
    contract: str = ""


def _share(count: int, n: int) -> float:
    return count / n if n else 0.0


def _counts(metric: str, window: CohortWindow) -> tuple[int, int]:
    """(bad calls, calls judged) for a share metric: low confidence is judged on distinct answered requests."""
    if metric == "error_rate":
        return window.errors, window.requests
    if metric == "nan_rate":
        return window.nan, window.requests
    from mlrelease.model.estimator import LOW_CONFIDENCE  # here: the estimator module imports sklearn (~1.6 s)

    _, confidences = window.distinct_answers()
    return int((confidences < LOW_CONFIDENCE).sum()), len(confidences)


def _logs(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return np.log(array[np.isfinite(array) & (array > 0)])


def band_for(guardrail: Guardrail, candidate: CohortWindow, stable: CohortWindow) -> tuple[Band, float, float | None]:
    """The confidence band of the guardrail's difference, the candidate's value and the control's value."""
    alpha, tuned = guardrail.alpha, guardrail.min_samples
    metric = guardrail.metric
    if metric in ("error_rate", "nan_rate", "low_confidence_share"):
        bad_c, n_c = _counts(metric, candidate)
        if guardrail.limit is not None:
            return proportion_level(bad_c, n_c, guardrail.limit, alpha=alpha, tuned_at=tuned), _share(bad_c, n_c), None
        bad_s, n_s = _counts(metric, stable)
        band = proportion_difference(bad_c, n_c, bad_s, n_s, alpha=alpha, tuned_at=tuned)
        return band, _share(bad_c, n_c), _share(bad_s, n_s)
    if metric == "latency":  # every call is an observation of the version's speed under this load
        c, s = _logs(candidate.latencies_s), _logs(stable.latencies_s)
    else:  # answers (ETA, or confidence for confidence_shift): each distinct request once
        which = 1 if metric == "confidence_shift" else 0
        c, s = _logs(candidate.distinct_answers()[which]), _logs(stable.distinct_answers()[which])
    band = mean_difference(c, s, alpha=alpha, tuned_at=tuned)
    median = lambda xs: float(np.exp(np.median(xs))) if len(xs) else None  # noqa: E731
    return band, median(c) or math.nan, median(s)


def evaluate(guardrail: Guardrail, cohort: str, candidate: CohortWindow, stable: CohortWindow) -> GuardrailResult:
    """Judge one contract on one cohort: continue below `min_samples` per arm, else what the band shows."""
    band, mine, theirs = band_for(guardrail, candidate, stable)
    tolerance = guardrail.log_tolerance
    contract = guardrail.describe()
    if guardrail.limit == 0 and guardrail.tolerance == 0 and (mine or 0) > 0:
        # A zero limit needs no statistics: one observed event proves the rate is above zero.
        bad, n = _counts(guardrail.metric, candidate)
        reason = f"{cohort} {guardrail.metric}: {bad} of {n} calls, over a zero limit → fail [{contract}]"
        return GuardrailResult(
            cohort, guardrail.metric, Verdict.FAIL, mine, theirs, tolerance, reason, band.as_dict(), contract
        )
    if band.samples < guardrail.min_samples:
        reason = f"{cohort} {guardrail.metric}: {band.samples} calls in the smaller arm, need {guardrail.min_samples}"
        return GuardrailResult(
            cohort, guardrail.metric, Verdict.CONTINUE, mine, theirs, tolerance, reason, band.as_dict(), contract
        )
    verdict = decide(band, guardrail.bad, tolerance)
    reason = f"{cohort} {guardrail.metric}: {_evidence(guardrail, band)} → {verdict} [{contract}]"
    return GuardrailResult(cohort, guardrail.metric, verdict, mine, theirs, tolerance, reason, band.as_dict(), contract)


def _evidence(guardrail: Guardrail, band: Band) -> str:
    """The estimate and its band in the guardrail's own units (relative shifts as percentages)."""
    if guardrail.metric in RELATIVE:
        pct = lambda x: f"{math.expm1(x):+.1%}" if math.isfinite(x) else ("+inf" if x > 0 else "-inf")  # noqa: E731
        return f"shift {pct(band.estimate)} (band {pct(band.lower)} … {pct(band.upper)}, n={band.samples})"
    against = f"limit {guardrail.limit:g}" if guardrail.limit is not None else "stable"
    return (
        f"Δ vs {against} {band.estimate * 100:+.2f} pp (band {band.lower * 100:+.2f} … {band.upper * 100:+.2f} pp, "
        f"n={band.samples})"
    )


def resolve_inconclusive(
    result: GuardrailResult, guardrail: Guardrail, *, exposed_enough: bool = True, final: bool = True
) -> GuardrailResult:
    """A `continue` becomes what the contract's `on_inconclusive` says: at the maximum exposure (`final`), and
    for `accept` already once the minimum exposure is over and the contract has its minimum sample (such a
    contract fails on evidence and does not hold a stage open beyond that: the choice for rare events whose
    non-inferiority would need far more calls than a stage has)."""
    if result.verdict is not Verdict.CONTINUE:
        return result
    # Early acceptance needs the question asked on enough data: below its minimum sample a contract stays open.
    enough = int(result.band.get("samples", 0)) >= guardrail.min_samples
    if not (final or (exposed_enough and enough and guardrail.on_inconclusive == "accept")):
        return result
    when = "at the maximum exposure" if final else "after the minimum exposure"
    note = f"; open {when} → {guardrail.on_inconclusive}"
    return replace(result, verdict=ON_INCONCLUSIVE[guardrail.on_inconclusive], reason=result.reason + note)


def withhold_pass(result: GuardrailResult, why: str, *, final: bool) -> GuardrailResult:
    """No pass from a window that contains an outage (`why`): a pass or an open question continues, and at the
    maximum exposure is inconclusive, which pauses whatever `on_inconclusive` says (`accept` would be a pass,
    `rollback` a verdict on the fault, not on the candidate). A fail stands: evidence of harm acts at once."""
    if result.verdict is Verdict.FAIL:
        return result
    verdict = Verdict.INCONCLUSIVE if final else Verdict.CONTINUE
    return replace(result, verdict=verdict, reason=f"{result.reason}; {why} → {verdict}")


def result_dict(result: GuardrailResult) -> dict[str, Any]:
    """JSON-friendly form of one result."""
    return {
        "cohort": result.cohort,
        "metric": result.metric,
        "verdict": str(result.verdict),
        "candidate": result.candidate,
        "stable": result.stable,
        "threshold": result.threshold,
        "reason": result.reason,
        "band": result.band,
        "contract": result.contract,
    }
