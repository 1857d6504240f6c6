"""Step `analyze`: one look at the open stage (the pure `rollout.tick.look`), then act on its decision."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.rollout.analysis import StageAnalysis
from mlrelease.rollout.answer import question
from mlrelease.rollout.context import DRAIN_S, RolloutContext, iso
from mlrelease.rollout.machine import Action, ActionKind, Phase, apply
from mlrelease.rollout.store import RolloutRecord, now_utc
from mlrelease.rollout.tick import look
from mlrelease.settings import Settings
from mlrelease.steps.rollout.rollback import finish_rollback
from mlrelease.steps.rollout.stage import check_position, stage_result
from mlrelease.timewindow import parse_run_key


def _tick(ctx: RolloutContext, record: RolloutRecord, stage: int) -> tuple[Action, StageAnalysis, datetime]:
    """One look at the stage (`mlrelease.rollout.tick.look`), its evidence appended to the record's trail."""
    assert record.stage_opened_at is not None
    now = now_utc()
    routing = ctx.router.current()
    tripped = routing.tripped.get(record.candidate_version) if routing else None
    action, analysis = look(record, record.plan, record.profile, ctx.source, ctx.cohorts, now, tripped=tripped)
    ctx.store.append_evidence(
        record,
        {
            "at": now.isoformat(),
            "stage": stage,
            "elapsed_s": round((now - record.stage_opened_at).total_seconds(), 3),
            "results": analysis.evidence(),
            "outages": [o.as_dict() for o in analysis.outages],
        },
    )
    return action, analysis, now


def analyze(
    settings: Settings,
    stage: int,
    version: int,
    run_key: str,
    *,
    tick: bool = False,
    poll_s: float | None = None,
    ask: bool = False,
) -> dict[str, Any]:
    """Judge stage `stage` and act: advance, roll a cohort back, roll everything back, pause, or clear promotion.

    With `tick`, one look per call: while nothing is decided it returns `decided: false` and the time of the
    next check, and the DAG defers until then (no process waits through a stage). Without it, it looks every
    `poll_s` (default: the stage's check interval) until a decision, which the maximum exposure bounds.
    With `ask`, a pause (or a promotion the plan wants confirmed) is a question for the approval task that follows:
    the result carries it (`question`) and the step succeeds; without it a pause ends the step skipped.
    """
    ctx = RolloutContext.open(settings)
    record = ctx.owned(run_key, version)
    done = [e for e in record.history if e.kind == "analysis" and e.stage == stage]
    if done and (record.stage > stage or record.phase is Phase.PROMOTED or done[-1].detail["action"] == "promote"):
        return _asking({**stage_result(record, stage), **done[-1].detail, "status": "already analysed"}, record, ask)
    if done and ask and record.phase is Phase.PAUSED and record.stage == stage:  # a retry after the pause
        return _asking({**stage_result(record, stage), **done[-1].detail, "status": "paused"}, record, ask)
    if record.phase is Phase.ROLLING_BACK:  # decided by an earlier tick (or a person), routing not confirmed
        record = finish_rollback(ctx, record)[0]
        raise GateFailed(f"rolled back v{version} to v{record.stable_version}: {record.reason}")
    check_position(record, stage)
    if record.stage_opened_at is None:
        raise StepError(f"stage {stage} was never opened: run rollout-stage --stage {stage} first")
    every = record.plan.stage(stage).check_every_s[record.profile]
    while True:
        action, analysis, now = _tick(ctx, record, stage)
        if action.kind is not ActionKind.WAIT:
            break
        if tick:
            return {
                **stage_result(record, stage),
                **analysis.as_dict(),
                "status": "not yet",
                "decided": False,
                "reason": action.reason,
                "next_check_at": iso(now + timedelta(seconds=every)),
            }
        time.sleep(every if poll_s is None else poll_s)
    return {**_act(settings, ctx, record, stage, action, analysis, now, ask=ask), "decided": True}


def _asking(result: dict[str, Any], record: RolloutRecord, ask: bool) -> dict[str, Any]:
    """A decided result, with the question the approval task asks about it (none: `question` is null)."""
    stage, action = result["stage"], str(result.get("action", ""))
    asked = question(record, stage, action, str(result.get("reason", ""))) if ask else None
    return {**result, "decided": True, "question": asked}


def _act(
    settings: Settings,
    ctx: RolloutContext,
    record: RolloutRecord,
    stage: int,
    action: Action,
    analysis: StageAnalysis,
    now: datetime,
    *,
    ask: bool = False,
) -> dict[str, Any]:
    """Carry out a decided tick: traffic first, then the record (a full rollback: the decision, traffic, the record)."""
    version = record.candidate_version
    detail = {
        "action": str(action.kind),
        "reason": action.reason,
        "cohorts": list(action.cohorts),
        "decided_at": iso(now),
    }
    analysed = record.with_event("analysis", now, stage, **detail, **analysis.as_dict())
    kind = action.kind
    if kind is ActionKind.ROLLBACK_ALL:
        # The decision is stored first, as rolling back with the verdict's reason: traffic may still reach the
        # candidate, and the record says so until routing confirms stable (a failed routing leaves it there).
        decided = replace(action, reason=f"{action.reason}: {analysis.summary()}")
        record = ctx.record_update(record, apply(analysed, decided, record.plan, now))
        finish_rollback(ctx, record)
        raise GateFailed(f"rolled back v{version} to v{record.stable_version}: {analysis.summary()}")
    record = ctx.record_update(record, analysed)
    result = {**stage_result(record, stage), **detail, **analysis.as_dict()}
    if kind is ActionKind.PROMOTE:
        return _asking({**result, "status": "every stage passed: ready to promote"}, record, ask)
    state = apply(record, action, record.plan, now)
    if kind is ActionKind.ROLLBACK_COHORT:
        # Traffic first, for the stage that breached: the cohort back on stable, the others keep the candidate
        # (the next stage's shares are routed only when rollout-stage opens it).
        held = record.model_copy(update={"excluded_cohorts": state.excluded_cohorts})
        ctx.route(record, held, action.reason, clear_trips=True)
        # Calls the gateway routed before it saw the change may still fail and trip the candidate for the
        # cohorts that keep it: after the drain, clear those late trips once more (the write is idempotent).
        time.sleep(DRAIN_S)
        ctx.route(record, held, action.reason, clear_trips=True)
        record = ctx.record_update(
            record,
            state.with_event("cohort_rolled_back", now, stage, cohorts=list(action.cohorts), reason=analysis.summary()),
        )
        result["diagnosis"] = _diagnose_all(settings, ctx, record, stage, action.cohorts)
        ctx.registry.tag_version(version, rollout_rolled_back_cohorts=",".join(record.excluded_cohorts))
    else:
        record = ctx.record_update(record, state)
    if record.phase is Phase.PAUSED:
        if not ask:
            raise Skipped(f"rollout of v{version} paused: {record.reason}")
        return _asking({**result, "status": "paused: a human decides"}, record, ask)
    return _asking({**result, "status": str(kind)}, record, ask)


def _diagnose_all(
    settings: Settings, ctx: RolloutContext, record: RolloutRecord, stage: int, cohorts: tuple[str, ...]
) -> dict[str, Any]:
    if not record.plan.stage(stage).diagnose:
        return {}
    from mlrelease.steps.diagnose import diagnose

    opened = next(e.at for e in record.history if e.kind == "stage_opened" and e.stage == stage)
    end = parse_run_key(record.run_key)
    return {c: diagnose(settings, c, since=opened, until=now_utc(), data_end=end, source=ctx.source) for c in cohorts}
