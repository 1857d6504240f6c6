"""One look at an open stage, pure given the metrics: judge it, then decide what the rollout does next.

The DAG's `analyze --tick` step, the verdict simulator (`bench/bench_verdict_sim.py`) and the tests call this one
function, so what is measured in simulation is what runs in production.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from mlrelease.rollout.analysis import StageAnalysis, analyze_stage
from mlrelease.rollout.machine import Action, ActionKind, RolloutState, exposure, next_action
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.rollout.plan import Profile, RolloutPlan


def baseline_window(state: RolloutState, plan: RolloutPlan, profile: Profile) -> tuple[datetime, datetime] | None:
    """The pre-rollout window whose per-user sums are every contract's covariate: `baseline_s` before the rollout
    started, but never before `state.baseline_since` (the previous rollout's end: its candidate held the same
    buckets, so earlier traffic would differ between the arms). None without a start or a lookback."""
    lookback = plan.baseline_s[profile]
    if state.started_at is None or lookback <= 0:
        return None
    since = state.started_at - timedelta(seconds=lookback)
    if state.baseline_since is not None:
        since = max(since, state.baseline_since)
    return (since, state.started_at) if since < state.started_at else None


def look(
    state: RolloutState,
    plan: RolloutPlan,
    profile: Profile,
    source: MetricsSource,
    cohorts: tuple[str, ...],
    now: datetime,
    *,
    tripped: str | None = None,
) -> tuple[Action, StageAnalysis]:
    """The open stage's analysis so far and the machine's decision on it; `tripped` is the fast guard's reason."""
    assert state.stage_opened_at is not None, "look at an open stage only"
    exposed_enough, final = exposure(state, plan, profile, now)
    before = baseline_window(state, plan, profile)
    analysis = analyze_stage(
        plan.stage(state.stage),
        cohorts,
        source,
        candidate=state.candidate_version,
        stable=state.stable_version,
        opened_at=state.stage_opened_at,
        now=now,
        excluded=state.excluded_cohorts,
        exposed_enough=exposed_enough,
        final=final,
        tripped=tripped,
        max_gap_s=plan.max_gap_s[profile],
        before=before,
    )
    action = next_action(state, plan, profile, now, analysis.verdicts)
    if analysis.outages and action.kind in (ActionKind.WAIT, ActionKind.PAUSE):  # say why the stage did not pass
        action = replace(action, reason=f"{action.reason}; {analysis.outage_note()}")
    return action, analysis
