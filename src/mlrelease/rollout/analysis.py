"""One stage's analysis: every guardrail on every cohort open to the candidate, candidate against stable.

The reference is stable on the same cohort and window (for latency: stable's calls of every cohort in the
same window, since latency depends on load more than on the cohort). Where a stage sends the whole cohort to the
candidate, stable has no traffic of that cohort in the window, so the reference reaches back before the
stage opened (up to `LOOKBACK_WINDOWS` stage lengths) for stable's most recent traffic of the cohort; the
result says which reference it used. Stable's earlier windows also feed the dynamic baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mlrelease.rollout.guardrails import (
    LATENCY,
    CohortWindow,
    GuardrailResult,
    Verdict,
    evaluate,
    measure,
    worst,
)
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.rollout.plan import Stage

LOOKBACK_WINDOWS = 6
EMPTY = CohortWindow(requests=0, errors=0, nan=0, low_confidence=0, p99_latency_s=0.0)


@dataclass(frozen=True)
class StageAnalysis:
    """Per-cohort verdicts and every guardrail result behind them."""

    verdicts: dict[str, Verdict]
    results: tuple[GuardrailResult, ...]
    samples: dict[str, dict[str, int]]

    def breaches(self) -> list[GuardrailResult]:
        """The failed results (what an alert quotes)."""
        return [r for r in self.results if r.verdict is Verdict.FAIL]

    def summary(self) -> str:
        """One line per breach, or the verdicts when nothing failed."""
        failed = self.breaches()
        if failed:
            return "; ".join(r.reason for r in failed)
        return ", ".join(f"{c}: {v}" for c, v in sorted(self.verdicts.items()))

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form for the rollout record and the step's result."""
        return {
            "verdicts": {c: str(v) for c, v in sorted(self.verdicts.items())},
            "samples": self.samples,
            "results": [
                {
                    "cohort": r.cohort,
                    "metric": r.metric,
                    "verdict": str(r.verdict),
                    "candidate": r.candidate,
                    "stable": r.stable,
                    "threshold": r.threshold,
                    "reason": r.reason,
                }
                for r in self.results
            ],
        }


def open_cohorts(stage: Stage, cohorts: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[str, ...]:
    """The cohorts this stage sends some candidate traffic to, minus those already rolled back."""
    default = stage.candidate_percent.get("*", 0.0)
    return tuple(c for c in cohorts if stage.candidate_percent.get(c, default) > 0 and c not in excluded)


def analyze_stage(
    stage: Stage,
    cohorts: tuple[str, ...],
    source: MetricsSource,
    *,
    candidate: int,
    stable: int,
    opened_at: datetime,
    now: datetime,
    tripped: str | None = None,
) -> StageAnalysis:
    """Judge the stage so far; `tripped` is the gateway fast guard's reason when it took the candidate out."""
    length = max(now - opened_at, timedelta(seconds=1))
    lookback_start = opened_at - LOOKBACK_WINDOWS * length
    current = source.windows(opened_at, now)
    noise = _latency_noise(source, opened_at, now, stable, stage.min_samples)
    extended = source.windows(lookback_start, now)
    earlier = [source.windows(opened_at - (k + 1) * length, opened_at - k * length) for k in range(LOOKBACK_WINDOWS)]
    results: list[GuardrailResult] = []
    samples: dict[str, dict[str, int]] = {}
    for cohort in cohorts:
        mine = current.get((cohort, candidate), EMPTY)
        theirs = current.get((cohort, stable), EMPTY)
        reference = theirs if theirs.requests >= stage.min_samples else extended.get((cohort, stable), EMPTY)
        # Latency depends on load more than on the cohort: compare with stable's calls in the same window.
        same_load = current.get(("*", stable), EMPTY)
        latency_reference = same_load if same_load.requests >= stage.min_samples else reference
        samples[cohort] = {"candidate": mine.requests, "stable": reference.requests}
        for guardrail in stage.guardrails:
            if guardrail.cohorts and cohort not in guardrail.cohorts:
                continue
            history = [
                measure(guardrail.metric, w[(cohort, stable)], w[(cohort, stable)])
                for w in earlier
                if guardrail.baseline == "stable_dynamic"
                and (cohort, stable) in w
                and w[(cohort, stable)].requests >= stage.min_samples
            ]
            latency = guardrail.metric in LATENCY
            results.append(
                evaluate(
                    guardrail,
                    cohort,
                    mine,
                    latency_reference if latency else reference,
                    min_samples=stage.min_samples,
                    stable_history=history,
                    noise=noise.get(guardrail.metric, 1.0) if latency else 1.0,
                )
            )
    if tripped is not None:
        results.extend(_fast_guard(cohorts, current, candidate, tripped))
    verdicts = {c: worst(r.verdict for r in results if r.cohort == c) for c in cohorts}
    return StageAnalysis(verdicts, tuple(results), samples)


def _latency_noise(
    source: MetricsSource, opened_at: datetime, now: datetime, stable: int, min_samples: int
) -> dict[str, float]:
    """Stable against itself: the p50 and p99 ratios between the two halves of the window (A/A spread).

    With a few hundred calls per window a p99 is set by a handful of calls, and on a shared machine one
    burst of load moves it 2-3x; a candidate's ratio inside that spread says nothing about the candidate.
    """
    half = opened_at + (now - opened_at) / 2
    first = source.windows(opened_at, half).get(("*", stable), EMPTY)
    second = source.windows(half, now).get(("*", stable), EMPTY)
    if min(first.requests, second.requests) < min_samples:
        return {}
    spread = {}
    for metric, a, b in (
        ("p50_latency_ratio", first.p50_latency_s, second.p50_latency_s),
        ("p99_latency_ratio", first.p99_latency_s, second.p99_latency_s),
    ):
        if a > 0 and b > 0:
            spread[metric] = max(a / b, b / a)
    return spread


def _fast_guard(
    cohorts: tuple[str, ...], current: dict[tuple[str, int], CohortWindow], candidate: int, tripped: str
) -> list[GuardrailResult]:
    """The gateway's trip as a verdict: the cohorts whose calls failed, or every open cohort if none did here."""
    failed = {c: current.get((c, candidate), EMPTY).errors + current.get((c, candidate), EMPTY).nan for c in cohorts}
    blame_all = not any(failed.values())
    results = []
    for cohort, count in failed.items():
        hit = blame_all or count > 0
        reason = (
            f"the gateway took v{candidate} out of service ({tripped})" if hit else "no failed calls on this cohort"
        )
        verdict = Verdict.FAIL if hit else Verdict.PASS
        results.append(
            GuardrailResult(cohort, "fast_guard", verdict, float(count), None, 0.0, f"{cohort} fast_guard: {reason}")
        )
    return results
