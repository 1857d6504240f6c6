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
    started, lookback = state.started_at or state.stage_opened_at, plan.baseline_s[profile]
    before = (started - timedelta(seconds=lookback), started) if lookback > 0 else None
    analysis = analyze_stage(
        plan.stages[state.stage],
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
