"""Step `rollout-stage`: begin the rollout record and open a stage (routing first, then the record)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.registry import CHAMPION, MODEL_NAME
from mlrelease.release_spec import process_spec
from mlrelease.rollout.context import RolloutContext, iso
from mlrelease.rollout.gates import alert_override, require_gates
from mlrelease.rollout.machine import ActionKind, Phase, apply, candidate_percent, next_action
from mlrelease.rollout.plan import Profile, load_plan
from mlrelease.rollout.store import RolloutRecord, now_utc
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.triton_repo import model_repository
from mlrelease.settings import Settings


def stage_result(record: RolloutRecord, stage: int) -> dict[str, Any]:
    """What a stage step reports: the stage, when it opened and when its first analysis is due."""
    opened = next(
        (e.at for e in record.history if e.kind == "stage_opened" and e.stage == stage), record.stage_opened_at
    )
    spec = record.plan.stage(stage)
    # The first look comes one check interval after the stage opened: a fail acts at once, a pass waits for
    # the minimum exposure (the analysis decides; the DAG only defers between its ticks).
    analyze_at = opened + timedelta(seconds=spec.check_every_s[record.profile]) if opened else None
    return {
        "model_version": record.candidate_version,
        "stable_version": record.stable_version,
        "stage": stage,
        "stage_name": spec.name,
        "phase": str(record.phase),
        "opened_at": iso(opened),
        "analyze_at": iso(analyze_at),
        "candidate_percent": candidate_percent(record, record.plan) if record.active else {},
    }


def _begin(
    ctx: RolloutContext, version: int, run_key: str, profile: Profile, plan_path: Path | None, wired: int | None
) -> RolloutRecord:
    champion = _skip_champion(ctx, version)
    current = ctx.store.read()
    if current is not None and (current.run_key, current.candidate_version) == (run_key, version):
        return current  # a rerun resumes the stored rollout, under the plan it started with
    # every contract's α drawn from the plan's budget, and its tolerance for the profile the rollout runs under
    plan = load_plan(plan_path)
    plan.check_task(process_spec().task)
    plan = plan.allocated(ctx.cohorts).under(profile)
    # the power check ran at load; the record keeps the plan it judges with, without the declared traffic, so that
    # reading an active record never re-runs a check (a stricter one later would make it unreadable)
    plan = plan.model_copy(update={"traffic": {}})
    if wired is not None and len(plan.stages) != wired:
        raise StepError(f"the rollout plan has {len(plan.stages)} stages but the DAG wires {wired}; make them match")
    proposed = RolloutRecord(
        model=MODEL_NAME,
        run_key=run_key,
        candidate_version=version,
        stable_version=champion,
        profile=profile,
        plan=plan,
        started_at=now_utc(),
        # the previous rollout's candidate held the same user buckets until it ended
        baseline_since=current.finished_at if current is not None else None,
    )
    return ctx.store.begin(proposed)


def _skip_champion(ctx: RolloutContext, version: int) -> int:
    """The champion's version; Skipped when `version` is the champion already (nothing to roll out)."""
    champion = ctx.registry.alias_version(CHAMPION)
    if champion is None or champion == version:
        raise Skipped(f"v{version} is the champion already (first release or promoted): nothing to roll out")
    return champion


def check_position(record: RolloutRecord, stage: int) -> None:
    """Refuse a step for a stage the plan does not have, or that the rollout has not reached or is past."""
    if not 1 <= stage <= len(record.plan.stages):
        raise StepError(f"--stage {stage} is not in the plan (it has {len(record.plan.stages)} stages)")
    if record.phase is Phase.ROLLED_BACK:
        raise GateFailed(f"the rollout of v{record.candidate_version} was rolled back: {record.reason}")
    if record.phase is Phase.ROLLING_BACK:
        raise GateFailed(
            f"the rollout of v{record.candidate_version} is being rolled back ({record.reason}); routing has not "
            "confirmed it yet: `mlrelease step rollback` finishes it"
        )
    if record.phase is Phase.PAUSED:
        raise Skipped(f"the rollout of v{record.candidate_version} is paused for a human: {record.reason}")
    if record.stage < stage:
        raise StepError(
            f"stage {stage} is not reached: the rollout is at stage {record.stage} "
            f"({record.plan.stage(record.stage).name}); analyze that stage first"
        )


def rollout_stage(
    settings: Settings,
    stage: int,
    version: int,
    run_key: str,
    *,
    profile: Profile,
    plan_path: Path | None = None,
    wired_stages: int | None = None,
    override_gates: str | None = None,
) -> dict[str, Any]:
    """Open stage `stage` (0-based) of `version`'s rollout: route its cohorts, record when it opened."""
    ctx = RolloutContext.open(settings)
    ctx.require_observed()
    if stage == 0:
        _skip_champion(ctx, version)
    overridden = checked_gates(ctx, version, "rollout-stage", override_gates)  # before any record or traffic moves
    record = (
        _begin(ctx, version, run_key, profile, plan_path, wired_stages) if stage == 1 else ctx.owned(run_key, version)
    )
    if record.phase is Phase.PROMOTED or record.stage > stage:
        return {**stage_result(record, min(stage, len(record.plan.stages))), "status": "already opened"}
    check_position(record, stage)
    now = now_utc()
    action = next_action(record, record.plan, record.profile, now, None)
    if action.kind is not ActionKind.OPEN_STAGE:
        return {**stage_result(record, stage), "status": "already opened"}
    if overridden is not None:
        record = ctx.record_update(record, record.with_event("gates_overridden", now, stage, **overridden))
    state = apply(record, action, record.plan, now)
    routing = ctx.route(record, state, action.reason)  # traffic first: a crash here reopens the same stage
    shares = candidate_percent(state, record.plan)
    record = ctx.record_update(
        record,
        state.with_event("stage_opened", now, stage, candidate_percent=shares, routing_revision=routing.revision),
    )
    return {**stage_result(record, stage), "status": "opened", "routing_revision": routing.revision}


def checked_gates(ctx: RolloutContext, version: int, step: str, override: str | None) -> dict[str, Any] | None:
    """Refuse a version whose earlier gates failed or never ran; with a human's override, tag and alert it.

    The file itself is verified too, and no override covers it: traffic only ever goes to the bytes that
    were exported (and checked by every gate since).
    """
    verify_version(model_repository(ctx.settings), version, registry=ctx.registry)
    problems = require_gates(version, ctx.registry.version_tags(version), step, override)
    if not problems:
        return None
    assert override is not None
    ctx.registry.tag_version(version, gates_overridden=f"{step}: {override}"[:500])
    return alert_override(version, step, problems, override, ctx.settings.alert_webhook)
