"""Guardrail verdicts: each contract of the plan judged on the candidate and its concurrent control (pure).

A guardrail compares the candidate's calls with stable's calls *of the same cohort in the same window*
(the control slice), through an anytime-valid confidence sequence (`mlrelease.verdicts.sequential`), and
decides fail / pass / continue against its tolerance (`mlrelease.verdicts.decide`). Verdicts are ordered
pass < continue < inconclusive < fail, and that order is data (`SEVERITY`), so combining many verdicts is
taking the worst one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mlrelease.rollout.plan import RELATIVE, Guardrail
from mlrelease.rollout.windows import EMPTY, LATENCY_BOUNDS_S, CohortWindow, on_units
from mlrelease.verdicts.decide import ON_INCONCLUSIVE, SEVERITY, Verdict, decide, worst
from mlrelease.verdicts.sequential import Band, UserSums, adjusted_difference, clustered_ratio, ratio_level

__all__ = ["EMPTY", "SEVERITY", "CohortWindow", "GuardrailResult", "Verdict", "evaluate", "worst"]


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


# Per metric: the per-user sums whose ratio is judged (numerator, denominator), and whether it is a share of calls.
RATIOS: dict[str, tuple[str, str]] = {
    "error_rate": ("failed", "calls"),
    "nan_rate": ("nan", "calls"),
    "low_confidence_share": ("low_confidence", "answers"),
    "latency": ("log_latency", "calls"),
    "prediction_shift": ("log_eta", "answers"),
    "confidence_shift": ("log_confidence", "answers"),
}


def tail_bound(guardrail: Guardrail, stable: CohortWindow) -> int:
    """The latency bound (index into LATENCY_BOUNDS_S) at stable's `quantile`: the first one that at most a share
    1 − quantile of stable's requests exceed. Only stable's requests choose it, never the candidate's."""
    calls = stable.total("calls")
    if calls <= 0:
        return len(LATENCY_BOUNDS_S) - 1
    above = stable.slow.sum(axis=0) / calls
    within = np.flatnonzero(above <= 1.0 - guardrail.quantile)
    return int(within[0]) if len(within) else len(LATENCY_BOUNDS_S) - 1


def _sums(guardrail: Guardrail, window: CohortWindow, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-user numerator and denominator the guardrail's ratio is taken over."""
    if guardrail.metric == "latency_tail":
        return window.slow[:, bound], window.calls
    numerator, denominator = RATIOS[guardrail.metric]
    return getattr(window, numerator), getattr(window, denominator)


def _user_sums(guardrail: Guardrail, window: CohortWindow, before: CohortWindow, bound: int) -> UserSums:
    """An arm's per-user sums in the window beside the same users' sums before the rollout (the covariate)."""
    y, n = _sums(guardrail, window, bound)
    x, m = _sums(guardrail, before, bound)
    return UserSums(y, n, on_units(before.units, x, window.units), on_units(before.units, m, window.units))


def band_for(
    guardrail: Guardrail, candidate: CohortWindow, stable: CohortWindow, before: CohortWindow = EMPTY
) -> tuple[Band, float, float | None]:
    """The confidence band of the guardrail's difference, the candidate's value and the control's value.

    Shares are of requests (or of distinct answers); relative metrics are means on the log scale, reported as
    geometric means. Every variance is clustered by user (see `mlrelease.verdicts.sequential.clustered_ratio`), and a
    comparison with stable is adjusted on each user's own pre-rollout sums in `before` (CUPED, see
    `mlrelease.verdicts.sequential.adjusted_difference`); a limit has no control arm to adjust against.
    """
    alpha, tuned = guardrail.alpha, guardrail.min_samples
    if alpha is None:
        if not guardrail.exact:
            raise ValueError(f"{guardrail.describe()}: its α is unset; judge with RolloutPlan.allocated(cohorts)")
        alpha = 0.01  # a zero limit is decided exactly; its band is shown for the record only
    bound = tail_bound(guardrail, stable) if guardrail.metric == "latency_tail" else 0
    share = guardrail.metric not in RELATIVE
    if guardrail.limit is not None:
        mine = clustered_ratio(*_sums(guardrail, candidate, bound), share=share)
        return ratio_level(mine, guardrail.limit, alpha=alpha, tuned_at=tuned), mine.estimate, None
    band = adjusted_difference(
        _user_sums(guardrail, candidate, before, bound),
        _user_sums(guardrail, stable, before, bound),
        share=share,
        alpha=alpha,
        tuned_at=tuned,
    )
    candidate_level = _level(*_sums(guardrail, candidate, bound))
    stable_level = _level(*_sums(guardrail, stable, bound))
    if guardrail.metric in RELATIVE:
        return band, _exp(candidate_level), _exp(stable_level)
    return band, candidate_level, stable_level


def _level(y: np.ndarray, n: np.ndarray) -> float:
    """An arm's ratio Σy/Σn, for the record (the band has the variance)."""
    total = float(n.sum())
    return float(y.sum()) / total if total > 0 else math.nan


def _exp(value: float) -> float:
    return float(np.exp(value)) if np.isfinite(value) else math.nan


def evaluate(
    guardrail: Guardrail, cohort: str, candidate: CohortWindow, stable: CohortWindow, before: CohortWindow = EMPTY
) -> GuardrailResult:
    """Judge one contract on one cohort: continue below `min_samples` per arm, else what the band shows; `before` is
    the cohort's pre-rollout window (every user on stable), the covariate of a comparison with stable."""
    band, mine, theirs = band_for(guardrail, candidate, stable, before)
    contract = guardrail.describe()

    def result(verdict: Verdict, reason: str) -> GuardrailResult:
        return GuardrailResult(
            cohort, guardrail.metric, verdict, mine, theirs, guardrail.log_tolerance, reason, band.as_dict(), contract
        )

    what = f"{cohort} {guardrail.metric}"
    if guardrail.limit == 0 and guardrail.tolerance == 0 and (mine or 0) > 0:
        # A zero limit needs no statistics: one observed event proves the rate is above zero.
        numerator, denominator = RATIOS[guardrail.metric]
        bad, n = candidate.total(numerator), candidate.total(denominator)
        return result(Verdict.FAIL, f"{what}: {bad:.0f} of {n:.0f} calls, over a zero limit → fail [{contract}]")
    if band.samples < guardrail.min_samples:
        calls = f"{band.samples} calls in the smaller arm, need {guardrail.min_samples}"
        return result(Verdict.CONTINUE, f"{what}: {calls}")
    if band.effective_users is not None and band.effective_users < guardrail.min_users:
        users = f"{band.effective_users:.1f} effective users in the smaller arm, need {guardrail.min_users}"
        return result(Verdict.CONTINUE, f"{what}: {users}")
    verdict = decide(band, guardrail.bad, guardrail.log_tolerance)
    return result(verdict, f"{what}: {_evidence(guardrail, band)} → {verdict} [{contract}]")


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
    """A `continue` becomes what the contract's `on_inconclusive` says (pause or roll back) at the maximum exposure
    (`final`). A zero limit with no event in its minimum sample passes once the minimum exposure is over: one event
    would have failed it, and none is the evidence it asks for."""
    if result.verdict is not Verdict.CONTINUE:
        return result
    samples = int(result.band.get("samples", 0))
    if guardrail.exact and exposed_enough and samples >= guardrail.min_samples:
        return replace(result, verdict=Verdict.PASS, reason=f"{result.reason}; none in {samples} requests → pass")
    if not final:
        return result
    note = f"; open at the maximum exposure → {guardrail.on_inconclusive}"
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
