"""Guardrail verdicts: the candidate against stable on the same cohort and window (pure functions).

Verdicts are ordered pass < inconclusive < fail, and that order is data (`SEVERITY`), so combining
many verdicts is taking the worst one, not a ladder of ifs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mlrelease.rollout.plan import Guardrail

MIN_HISTORY = 3  # stable windows needed before a dynamic baseline replaces the fixed threshold
COMPARISONS = ("p50_latency_ratio", "p99_latency_ratio", "prediction_shift_ks")  # candidate relative to stable
LATENCY = ("p50_latency_ratio", "p99_latency_ratio")
KS_ALPHA = 0.01  # a prediction shift fails only when the KS test is also significant at this level


class Verdict(StrEnum):
    """The outcome of one guardrail, or of many combined."""

    PASS = "pass"
    INCONCLUSIVE = "inconclusive"
    FAIL = "fail"


SEVERITY: dict[Verdict, int] = {Verdict.PASS: 0, Verdict.INCONCLUSIVE: 1, Verdict.FAIL: 2}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict (pass when there are none)."""
    return max(verdicts, key=SEVERITY.__getitem__, default=Verdict.PASS)


@dataclass(frozen=True)
class CohortWindow:
    """One version's traffic in one cohort over the judged window."""

    requests: int
    errors: int
    nan: int
    low_confidence: int
    p99_latency_s: float
    predictions: Sequence[float] = ()
    p50_latency_s: float = 0.0


@dataclass(frozen=True)
class GuardrailResult:
    """A guardrail's verdict with the numbers behind it (what an alert quotes)."""

    cohort: str
    metric: str
    verdict: Verdict
    candidate: float | None
    stable: float | None
    threshold: float
    reason: str


def _share(count: int, window: CohortWindow) -> float:
    return count / window.requests if window.requests else 0.0


def measure(metric: str, window: CohortWindow, reference: CohortWindow) -> float:
    """The metric's value for `window`, relative to `reference` where the metric is a comparison."""
    if metric == "error_rate":
        return _share(window.errors, window)
    if metric == "nan_rate":
        return _share(window.nan, window)
    if metric == "low_confidence_share":
        return _share(window.low_confidence, window)
    if metric == "p99_latency_ratio":
        return window.p99_latency_s / reference.p99_latency_s if reference.p99_latency_s > 0 else float("inf")
    if metric == "p50_latency_ratio":
        return window.p50_latency_s / reference.p50_latency_s if reference.p50_latency_s > 0 else float("inf")
    if metric == "prediction_shift_ks":
        return float(_ks_test(window, reference).statistic)
    raise ValueError(f"unknown guardrail metric {metric!r}")


def ks_pvalue(window: CohortWindow, reference: CohortWindow) -> float:
    """The two-sample KS test's p-value for the two windows' predictions."""
    return float(_ks_test(window, reference).pvalue)


def _ks_test(window: CohortWindow, reference: CohortWindow) -> Any:
    # Imported here: scipy costs ~2 s, and everything that only reads or writes rollout records (the
    # store, the alert callbacks in Airflow) imports this module through the state machine.
    from scipy.stats import ks_2samp

    return ks_2samp(window.predictions, reference.predictions)


def threshold(guardrail: Guardrail, stable_history: Sequence[float]) -> tuple[float, str]:
    """The breach threshold and where it came from: fixed, or raised to stable's own mean + 2σ.

    A dynamic baseline only ever raises the fixed number: it exists for cohorts where stable itself sits
    above the fixed threshold (which would fail every candidate). Lowering it to a stable that happened
    to be perfect (0 ± 0) would fail any candidate for a single low-confidence answer.
    """
    if guardrail.baseline == "stable_dynamic" and len(stable_history) >= MIN_HISTORY:
        mean, sigma = statistics.fmean(stable_history), statistics.pstdev(stable_history)
        if mean + 2 * sigma > guardrail.max:
            return mean + 2 * sigma, f"stable mean {mean:.4g} + 2σ ({sigma:.3g}) over {len(stable_history)} windows"
        return guardrail.max, f"fixed (stable mean {mean:.4g} + 2σ below it)"
    return guardrail.max, "fixed"


def evaluate(
    guardrail: Guardrail,
    cohort: str,
    candidate: CohortWindow,
    stable: CohortWindow,
    *,
    min_samples: int,
    stable_history: Sequence[float] = (),
    noise: float = 1.0,
) -> GuardrailResult:
    """Judge one guardrail on one cohort: inconclusive below `min_samples`, fail above the threshold.

    `noise` (latency ratios only) is how far stable drifts from itself within the window; a ratio
    inside it is not the candidate's doing, so it widens the threshold.
    """
    limit, source = threshold(guardrail, stable_history)
    if guardrail.metric in LATENCY and noise > limit:
        limit, source = noise, f"widened to stable's own spread in this window (configured {guardrail.max:g})"
    compares = guardrail.metric in COMPARISONS
    short = candidate.requests < min_samples or (compares and stable.requests < min_samples)
    if short:
        reason = (
            f"{cohort} {guardrail.metric}: not enough traffic (candidate {candidate.requests}, "
            f"stable {stable.requests}, need {min_samples})"
        )
        return GuardrailResult(cohort, guardrail.metric, Verdict.INCONCLUSIVE, None, None, limit, reason)
    value = measure(guardrail.metric, candidate, stable)
    baseline = None if compares else measure(guardrail.metric, stable, stable)
    breached = value > limit
    note = ""
    if guardrail.metric == "prediction_shift_ks":
        # On small windows two samples of the same distribution differ by chance: only a significant shift fails.
        p = ks_pvalue(candidate, stable)
        breached, note = breached and p < KS_ALPHA, f", p={p:.2g}"
    verdict = Verdict.FAIL if breached else Verdict.PASS
    against = "" if baseline is None else f" (stable {baseline:.4g})"
    reason = (
        f"{cohort} {guardrail.metric} {value:.4g}{against}{note} {'>' if value > limit else '<='} {limit:.4g} "
        f"[{source}]"
    )
    return GuardrailResult(cohort, guardrail.metric, verdict, value, baseline, limit, reason)
