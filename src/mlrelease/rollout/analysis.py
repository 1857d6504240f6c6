"""One stage's analysis: every contract on every judged cohort, the candidate's arm against its concurrent control.

The arms are assignments: the candidate's arm is every request whose user the routing assigned to the candidate,
whoever answered it (a candidate failure retried on stable is a candidate failure); the control is the requests of
the same cohort in the same window whose users are assigned to stable (every judged cohort keeps a sticky slice on
stable while the stage runs; the plan refuses a stage without one). A judged cohort `*` pools every cohort that is
not rolled back. The gateway's fast guard (a relative test: failures falling on the candidate beyond its traffic
share) turns into a fail on the cohorts whose requests failed. An outage of serving itself
(`mlrelease.rollout.outage`) is cut out of the judged window; only one still going on holds a pass back, and at the
maximum exposure such a stage pauses for a human.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlrelease.rollout.guardrails import (
    EMPTY,
    CohortWindow,
    GuardrailResult,
    Verdict,
    evaluate,
    resolve_inconclusive,
    result_dict,
    withhold_pass,
    worst,
)
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.rollout.outage import Outage, find_outages
from mlrelease.rollout.plan import ALL, Stage
from mlrelease.rollout.windows import pooled


@dataclass(frozen=True)
class StageAnalysis:
    """Per-cohort verdicts, every guardrail result behind them, and the outages that kept the window from passing."""

    verdicts: dict[str, Verdict]
    results: tuple[GuardrailResult, ...]
    samples: dict[str, dict[str, int]]
    outages: tuple[Outage, ...] = ()

    def breaches(self) -> list[GuardrailResult]:
        """The failed results (what an alert quotes)."""
        return [r for r in self.results if r.verdict is Verdict.FAIL]

    def summary(self) -> str:
        """One line per breach, or the verdicts when nothing failed (and why the window cannot pass)."""
        failed = self.breaches()
        if failed:
            return "; ".join(r.reason for r in failed)
        verdicts = ", ".join(f"{c}: {v}" for c, v in sorted(self.verdicts.items()))
        return f"{verdicts}; {self.outage_note()}" if self.outages else verdicts

    def outage_note(self) -> str:
        """The outages of the window: cut out, or (still going on) why it cannot pass ('' without one)."""
        if not self.outages:
            return ""
        held = " no pass while it lasts" if any(o.ongoing for o in self.outages) else ""
        return f"outage: {'; '.join(o.describe() for o in self.outages)}{held}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form for the rollout record and the step's result."""
        return {
            "verdicts": {c: str(v) for c, v in sorted(self.verdicts.items())},
            "samples": self.samples,
            "results": [result_dict(r) for r in self.results],
            "outages": [o.as_dict() for o in self.outages],
        }

    def evidence(self) -> list[list[Any]]:
        """Compact per-result evidence for the trail the report plots.

        Each entry: cohort, metric, verdict, estimate, lower, upper, tolerance, contract.
        """
        return [
            [
                r.cohort,
                r.metric,
                str(r.verdict),
                r.band.get("estimate"),
                r.band.get("lower"),
                r.band.get("upper"),
                r.threshold,
                r.contract,
            ]
            for r in self.results
            if r.band
        ]


def open_cohorts(stage: Stage, cohorts: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[str, ...]:
    """The cohorts this stage sends some candidate traffic to, minus those already rolled back."""
    return tuple(c for c in cohorts if stage.share(c) > 0 and c not in excluded)


def _windows(
    current: dict[tuple[str, int], CohortWindow], versions: tuple[int, ...], pool: tuple[str, ...]
) -> dict[tuple[str, int], CohortWindow]:
    """Each version's window per cohort, and `*`: every cohort in `pool` merged (once per look, not per contract)."""
    windows = dict(current)
    for version in versions:
        windows[(ALL, version)] = pooled([current.get((name, version), EMPTY) for name in pool])
    return windows


def analyze_stage(
    stage: Stage,
    cohorts: tuple[str, ...],
    source: MetricsSource,
    *,
    candidate: int,
    stable: int,
    opened_at: datetime,
    now: datetime,
    excluded: tuple[str, ...] = (),
    exposed_enough: bool = False,
    final: bool = False,
    tripped: str | None = None,
    max_gap_s: float,
    before: tuple[datetime, datetime] | None = None,
) -> StageAnalysis:
    """Judge the stage so far; `tripped` is the fast guard's reason, if any.

    :param cohorts: the cohorts the gateway defines.
    :param excluded: cohorts already rolled back to stable (not judged, not pooled).
    :param exposed_enough: the stage's minimum exposure is over (a zero limit with no event may pass).
    :param final: the stage is at its maximum exposure (every open question resolves as the plan says).
    :param max_gap_s: a silence without model calls longer than this is an outage (the plan's `max_gap_s`).
    :param before: the stretch before the rollout started (every user on stable): each user's sums there are the
        covariate that takes the arms' difference in users out of every comparison with stable (CUPED).
    """
    outages = find_outages(source.timeline(opened_at, now, stable), max_gap_s)
    current = source.windows(opened_at, now, exclude=[(o.start, o.end) for o in outages if o.kind == "stable_failed"])
    ongoing = [o for o in outages if o.ongoing]
    why = f"serving is down ({ongoing[0].describe()})" if ongoing else ""
    pool = open_cohorts(stage, cohorts, excluded)
    arms = _windows(current, (candidate, stable), pool)
    baseline = _windows(source.windows(*before), (stable,), pool) if before else {}
    results: list[GuardrailResult] = []
    samples: dict[str, dict[str, int]] = {}
    for guardrail in stage.guardrails:
        for cohort in guardrail.cohorts or stage.judged:
            if cohort in excluded or (cohort != ALL and cohort not in pool):
                continue
            mine, control = arms.get((cohort, candidate), EMPTY), arms.get((cohort, stable), EMPTY)
            samples[cohort] = {"candidate": mine.requests, "stable": control.requests}
            result = evaluate(guardrail, cohort, mine, control, baseline.get((cohort, stable), EMPTY))
            if not ongoing:  # while serving is down an open question is never resolved by `on_inconclusive`
                result = resolve_inconclusive(result, guardrail, exposed_enough=exposed_enough, final=final)
            results.append(result)
    if tripped is not None:
        results.extend(_fast_guard(pool, current, candidate, tripped))
    if ongoing:  # nothing but evidence of harm (a fail) stands while serving is down
        results = [withhold_pass(r, why, final=final) for r in results]
    judged = sorted({r.cohort for r in results})
    verdicts = {c: worst(r.verdict for r in results if r.cohort == c) for c in judged}
    return StageAnalysis(verdicts, tuple(results), samples, outages)


def _fast_guard(
    cohorts: tuple[str, ...], current: dict[tuple[str, int], CohortWindow], candidate: int, tripped: str
) -> list[GuardrailResult]:
    """The gateway's trip as a verdict: the cohorts whose calls failed, or every open cohort if none did here."""
    failed = {c: _hard_failures(current.get((c, candidate), EMPTY)) for c in cohorts}
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


def _hard_failures(window: CohortWindow) -> int:
    return int(round(window.total("failed") + window.total("nan")))
