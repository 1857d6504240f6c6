"""Steps `rollout-stage`, `analyze`, `promote`, `rollback` and `retire`: the staged rollout, one tick per step.

Every step reads the durable rollout record, decides with the pure state machine, moves traffic first,
then stores the new state. A step that crashed is rerun from the stored state; a rerun of a step that
finished returns what it did before. A rollback of everything is the one decision stored before traffic
moves, as `rolling_back` (so no stage opens and no promotion happens meanwhile); it becomes `rolled_back`
only once routing reads back with nothing on the candidate, and any later `rollback` or `analyze` finishes it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME
from mlrelease.rollout.analysis import StageAnalysis
from mlrelease.rollout.consistency import ServingView, disagreements
from mlrelease.rollout.context import DRAIN_S, RolloutContext, iso
from mlrelease.rollout.gates import alert_override, require_gates
from mlrelease.rollout.machine import Action, ActionKind, Phase, apply, candidate_percent, next_action
from mlrelease.rollout.plan import Profile, load_plan
from mlrelease.rollout.store import RolloutRecord, now_utc
from mlrelease.rollout.tick import look
from mlrelease.serving.endpoint import triton_url
from mlrelease.serving.integrity import verify_version
from mlrelease.serving.triton_repo import model_repository
from mlrelease.settings import Settings
from mlrelease.timewindow import parse_run_key


def _stage_result(record: RolloutRecord, stage: int) -> dict[str, Any]:
    opened = next(
        (e.at for e in record.history if e.kind == "stage_opened" and e.stage == stage), record.stage_opened_at
    )
    spec = record.plan.stages[stage]
    # The first look comes one check interval after the stage opened: a fail acts at once, a pass waits for
    # the minimum exposure (the analysis decides; the DAG only defers between its ticks).
    analyze_at = opened + timedelta(seconds=spec.check_every_s[record.profile]) if opened else None
    return {
        "model_version": record.candidate_version,
        "stable_version": record.stable_version,
        "stage": stage + 1,
        "stage_name": spec.name,
        "phase": str(record.phase),
        "opened_at": iso(opened),
        "analyze_at": iso(analyze_at),
        "candidate_percent": candidate_percent(record.state(), record.plan) if record.active else {},
    }


def _begin(
    ctx: RolloutContext, version: int, run_key: str, profile: Profile, plan_path: Path | None, wired: int | None
) -> RolloutRecord:
    champion = _skip_champion(ctx, version)
    current = ctx.store.read()
    if current is not None and (current.run_key, current.candidate_version) == (run_key, version):
        return current  # a rerun resumes the stored rollout, under the plan it started with
    # every contract's α drawn from the plan's budget, and its tolerance for the profile the rollout runs under
    plan = load_plan(plan_path).allocated(ctx.cohorts).under(profile)
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
    )
    return ctx.store.begin(proposed)


def _skip_champion(ctx: RolloutContext, version: int) -> int:
    """The champion's version; Skipped when `version` is the champion already (nothing to roll out)."""
    champion = ctx.registry.alias_version(CHAMPION)
    if champion is None or champion == version:
        raise Skipped(f"v{version} is the champion already (first release or promoted): nothing to roll out")
    return champion


def _check_position(record: RolloutRecord, stage: int) -> None:
    if not 0 <= stage < len(record.plan.stages):
        raise StepError(f"--stage {stage + 1} is not in the plan (it has {len(record.plan.stages)} stages)")
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
            f"stage {stage + 1} is not reached: the rollout is at stage {record.stage + 1} "
            f"({record.plan.stages[record.stage].name}); analyze that stage first"
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
    overridden = _gates(ctx, version, "rollout-stage", override_gates)  # before any record or traffic moves
    record = (
        _begin(ctx, version, run_key, profile, plan_path, wired_stages) if stage == 0 else ctx.owned(run_key, version)
    )
    if record.phase is Phase.PROMOTED or record.stage > stage:
        return {**_stage_result(record, min(stage, len(record.plan.stages) - 1)), "status": "already opened"}
    _check_position(record, stage)
    now = now_utc()
    action = next_action(record.state(), record.plan, record.profile, now, None)
    if action.kind is not ActionKind.OPEN_STAGE:
        return {**_stage_result(record, stage), "status": "already opened"}
    if overridden is not None:
        record = ctx.record_update(record, record.with_event("gates_overridden", now, stage, **overridden))
    state = apply(record.state(), action, record.plan, now)
    routing = ctx.route(record, state, action.reason)  # traffic first: a crash here reopens the same stage
    shares = candidate_percent(state, record.plan)
    record = ctx.record_update(
        record,
        record.with_state(state, now).with_event(
            "stage_opened", now, stage, candidate_percent=shares, routing_revision=routing.revision
        ),
    )
    return {**_stage_result(record, stage), "status": "opened", "routing_revision": routing.revision}


def _gates(ctx: RolloutContext, version: int, step: str, override: str | None) -> dict[str, Any] | None:
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
    return alert_override(version, step, problems, override)


def _tick(ctx: RolloutContext, record: RolloutRecord, stage: int) -> tuple[Action, StageAnalysis, datetime]:
    """One look at the stage (`mlrelease.rollout.tick.look`), its evidence appended to the record's trail."""
    assert record.stage_opened_at is not None
    now = now_utc()
    routing = ctx.router.current()
    tripped = routing.tripped.get(record.candidate_version) if routing else None
    action, analysis = look(record.state(), record.plan, record.profile, ctx.source, ctx.cohorts, now, tripped=tripped)
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
    settings: Settings, stage: int, version: int, run_key: str, *, tick: bool = False, poll_s: float | None = None
) -> dict[str, Any]:
    """Judge stage `stage` and act: advance, roll a cohort back, roll everything back, pause, or clear promotion.

    With `tick`, one look per call: while nothing is decided it returns `decided: false` and the time of the
    next check, and the DAG defers until then (no process waits through a stage). Without it, it looks every
    `poll_s` (default: the stage's check interval) until a decision, which the maximum exposure bounds.
    """
    ctx = RolloutContext.open(settings)
    record = ctx.owned(run_key, version)
    done = [e for e in record.history if e.kind == "analysis" and e.stage == stage]
    if done and (record.stage > stage or record.phase is Phase.PROMOTED or done[-1].detail["action"] == "promote"):
        return {**_stage_result(record, stage), **done[-1].detail, "status": "already analysed", "decided": True}
    if record.phase is Phase.ROLLING_BACK:  # decided by an earlier tick (or a person), routing not confirmed
        record = _finish_rollback(ctx, record)[0]
        raise GateFailed(f"rolled back v{version} to v{record.stable_version}: {record.reason}")
    _check_position(record, stage)
    if record.stage_opened_at is None:
        raise StepError(f"stage {stage + 1} was never opened: run rollout-stage --stage {stage + 1} first")
    every = record.plan.stages[stage].check_every_s[record.profile]
    while True:
        action, analysis, now = _tick(ctx, record, stage)
        if action.kind is not ActionKind.WAIT:
            break
        if tick:
            return {
                **_stage_result(record, stage),
                **analysis.as_dict(),
                "status": "not yet",
                "decided": False,
                "reason": action.reason,
                "next_check_at": iso(now + timedelta(seconds=every)),
            }
        time.sleep(every if poll_s is None else poll_s)
    return {**_act(settings, ctx, record, stage, action, analysis, now), "decided": True}


def _act(
    settings: Settings,
    ctx: RolloutContext,
    record: RolloutRecord,
    stage: int,
    action: Action,
    analysis: StageAnalysis,
    now: datetime,
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
        record = ctx.record_update(record, analysed.with_state(apply(record.state(), decided, record.plan, now), now))
        _finish_rollback(ctx, record)
        raise GateFailed(f"rolled back v{version} to v{record.stable_version}: {analysis.summary()}")
    record = ctx.record_update(record, analysed)
    result = {**_stage_result(record, stage), **detail, **analysis.as_dict()}
    if kind is ActionKind.PROMOTE:
        return {**result, "status": "every stage passed: ready to promote"}
    state = apply(record.state(), action, record.plan, now)
    if kind is ActionKind.ROLLBACK_COHORT:
        # Traffic first, for the stage that breached: the cohort back on stable, the others keep the candidate
        # (the next stage's shares are routed only when rollout-stage opens it).
        held = replace(record.state(), excluded_cohorts=state.excluded_cohorts)
        ctx.route(record, held, action.reason, clear_trips=True)
        # Calls the gateway routed before it saw the change may still fail and trip the candidate for the
        # cohorts that keep it: after the drain, clear those late trips once more (the write is idempotent).
        time.sleep(DRAIN_S)
        ctx.route(record, held, action.reason, clear_trips=True)
        record = ctx.record_update(
            record,
            record.with_state(state, now).with_event(
                "cohort_rolled_back", now, stage, cohorts=list(action.cohorts), reason=analysis.summary()
            ),
        )
        result["diagnosis"] = _diagnose_all(settings, ctx, record, stage, action.cohorts)
        ctx.registry.tag_version(version, rollout_rolled_back_cohorts=",".join(record.excluded_cohorts))
    else:
        record = ctx.record_update(record, record.with_state(state, now))
    if record.phase is Phase.PAUSED:
        raise Skipped(f"rollout of v{version} paused: {record.reason}")
    return {**result, "status": str(kind)}


def _diagnose_all(
    settings: Settings, ctx: RolloutContext, record: RolloutRecord, stage: int, cohorts: tuple[str, ...]
) -> dict[str, Any]:
    if not record.plan.stages[stage].diagnose:
        return {}
    from mlrelease.steps.diagnose import diagnose

    opened = next(e.at for e in record.history if e.kind == "stage_opened" and e.stage == stage)
    end = parse_run_key(record.run_key)
    return {c: diagnose(settings, c, since=opened, until=now_utc(), data_end=end, source=ctx.source) for c in cohorts}


def rollback_all(ctx: RolloutContext, record: RolloutRecord, reason: str) -> dict[str, Any]:
    """Every cohort back on stable: the request stored (rolling back), traffic moved and confirmed, the record
    rolled back, then the candidate cleaned up. A rollback already under way keeps its first reason; `reason`
    is appended to the history (a `rollback_requested` event), never overwriting it."""
    if record.active:
        record = _request_rollback(ctx, record, reason)
    return _finish_rollback(ctx, record)[1]


def _request_rollback(ctx: RolloutContext, record: RolloutRecord, reason: str) -> RolloutRecord:
    """Store a rollback of everything as decided (before any traffic moves), or append `reason` to one under way."""
    now = now_utc()
    requested = record.with_event("rollback_requested", now, record.stage, reason=reason)
    decided = apply(record.state(), Action(ActionKind.ROLLBACK_ALL, record.stage, reason=reason), record.plan, now)
    return ctx.record_update(record, requested.with_state(decided, now))


def _finish_rollback(ctx: RolloutContext, record: RolloutRecord) -> tuple[RolloutRecord, dict[str, Any]]:
    """Complete a decided rollback (a rerun after it routes to stable again), then clean the candidate up."""
    if record.phase is Phase.ROLLING_BACK:
        record = _complete_rollback(ctx, record)
    else:  # rolled back already: the routing write is idempotent, and the cleanup may not have finished
        ctx.route(record, record.state(), record.reason, clear_trips=True)
    cleanup = ctx.retire_candidate(record, record.reason)
    return record, {
        "model_version": record.candidate_version,
        "stable_version": record.stable_version,
        "reason": record.reason,
        **cleanup,
    }


def _complete_rollback(ctx: RolloutContext, record: RolloutRecord) -> RolloutRecord:
    """Route everything to stable, read the routing back, and only then store the rollout as rolled back.

    Any failure (stable cannot be loaded, the routing store is down, the read-back still shows the candidate)
    leaves the record rolling back, with its reason; the next `rollback` or `analyze` tries again.
    """
    action = next_action(record.state(), record.plan, record.profile, now_utc(), None)
    assert action.kind is ActionKind.COMPLETE_ROLLBACK, action
    stays = f"the rollout of v{record.candidate_version} stays rolling back ({record.reason})"
    try:
        ctx.route(record, record.state(), record.reason, clear_trips=True)
        routing = ctx.router.current()
    except StepError as exc:
        raise StepError(f"{exc}; {stays}: rerun `mlrelease step rollback` to finish it") from exc
    if routing is None or routing.stable_version != record.stable_version:
        found = "no routing" if routing is None else f"stable v{routing.stable_version}"
        raise StepError(f"routing did not confirm the rollback to v{record.stable_version} (it reads {found}); {stays}")
    if record.candidate_version in routing.serving_versions():
        raise StepError(f"routing still sends traffic to v{record.candidate_version} after the rollback write; {stays}")
    now = now_utc()
    rolled_back = record.with_state(apply(record.state(), action, record.plan, now), now)
    return ctx.record_update(
        record,
        rolled_back.with_event(
            "rolled_back", now, record.stage, reason=record.reason, routing_revision=routing.revision
        ),
    )


def rollback(settings: Settings, run_key: str | None, *, cohort: str | None = None, reason: str) -> dict[str, Any]:
    """Roll the active rollout back (one cohort, or everything); with `run_key`, only that run's rollout."""
    ctx = RolloutContext.open(settings)
    record = ctx.store.read()
    if record is None or (run_key is not None and record.run_key != run_key):
        raise Skipped("nothing to roll back: no rollout of this run moved any traffic")
    if record.phase is Phase.PROMOTED:
        raise Skipped(f"nothing to roll back: v{record.candidate_version} was promoted (use --to-version)")
    if cohort is None:
        # A rollback already decided (by the analysis, or an earlier request whose routing failed) keeps its
        # reason; this request's reason is appended to the history.
        return {"status": "rolled back", **rollback_all(ctx, record, reason)}
    if cohort not in ctx.cohorts:
        raise StepError(f"--cohort {cohort!r} is not a gateway cohort; cohorts are {list(ctx.cohorts)}")
    if record.phase is Phase.ROLLING_BACK:
        raise StepError(
            f"v{record.candidate_version} is being rolled back entirely ({record.reason}): "
            "`mlrelease step rollback` without --cohort finishes it"
        )
    if not record.active:
        raise Skipped(f"nothing to roll back: the rollout is {record.phase}")
    now = now_utc()
    state = replace(record.state(), excluded_cohorts=tuple(sorted({*record.excluded_cohorts, cohort})))
    routing = ctx.route(record, state, reason)
    ctx.record_update(
        record,
        record.with_state(state, now).with_event(
            "cohort_rolled_back", now, record.stage, cohorts=[cohort], reason=reason
        ),
    )
    return {"status": f"{cohort} rolled back", "candidate_percent": routing.candidate_percent}


def rollback_to(settings: Settings, target: int, *, reason: str) -> dict[str, Any]:
    """Make `target` the only served version and the champion (manual rollback after a promotion)."""
    ctx = RolloutContext.open(settings)
    ctx.registry.version_tags(target)  # an unknown version fails here, naming it
    record = ctx.store.read()
    if record is not None and record.active:  # traffic to a candidate stops first
        rollback_all(ctx, record, reason)
    ctx.serve_only([target])
    from mlrelease.rollout.traffic_router import Routing

    routing = ctx.router.apply(Routing(stable_version=target), reason=reason, clear_trips=True)
    ctx.registry.client().set_registered_model_alias(MODEL_NAME, CHAMPION, str(target))
    ctx.registry.tag_version(target, rollout_status="restored", rollout_reason=reason[:500])
    return {"status": f"v{target} is champion and serves all traffic", "routing_revision": routing.revision}


def promote_paused(settings: Settings) -> dict[str, Any]:
    """A human's promotion of the paused rollout (from the rollback_release DAG or the CLI)."""
    record = RolloutContext.open(settings).store.read()
    if record is None or record.phase is not Phase.PAUSED:
        found = "no rollout" if record is None else f"the rollout of v{record.candidate_version} is {record.phase}"
        raise StepError(f"nothing to promote by hand: {found}, not paused")
    return promote(settings, record.candidate_version, record.run_key, by_hand=True)


def promote(
    settings: Settings, version: int, run_key: str, *, by_hand: bool = False, override_gates: str | None = None
) -> dict[str, Any]:
    """Make `version` champion: all traffic to it, alias moved, the previous champion kept loaded for a while.

    Only a rollout whose last stage passed analysis is promoted, unless a human promotes a paused one; and
    only a version whose earlier gates passed, unless a human overrides them (recorded and alerted).
    """
    ctx = RolloutContext.open(settings)
    record = ctx.owned(run_key, version)
    if record.phase is Phase.PROMOTED:
        return {"status": "already promoted", "model_version": version, "previous_version": record.stable_version}
    if record.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK):
        was = "is being" if record.phase is Phase.ROLLING_BACK else "was"
        raise GateFailed(f"v{version} {was} rolled back ({record.reason}); it cannot be promoted")
    overridden = _gates(ctx, version, "promote", override_gates)
    if overridden is not None:
        record = ctx.record_update(record, record.with_event("gates_overridden", now_utc(), record.stage, **overridden))
    last = len(record.plan.stages) - 1
    passed = [e for e in record.history if e.kind == "analysis" and e.stage == last and e.detail["action"] == "promote"]
    if not passed and not (by_hand and record.phase is Phase.PAUSED):
        raise StepError(f"v{version} has not passed the last stage's analysis: refusing to promote an unchecked model")
    now = now_utc()
    state = apply(record.state(), Action(ActionKind.PROMOTE, record.stage, reason="promoted"), record.plan, now)
    routing = ctx.route(record, state, "promote")  # traffic first; the alias is the commit point
    client = ctx.registry.client()
    client.set_registered_model_alias(MODEL_NAME, CHAMPION, str(version))
    if ctx.registry.alias_version(CHALLENGER) == version:
        client.delete_registered_model_alias(MODEL_NAME, CHALLENGER)
    unload_after = now + timedelta(seconds=record.plan.keep_previous_s[record.profile])
    ctx.registry.tag_version(version, rollout_status="promoted_by_hand" if by_hand else "promoted")
    ctx.registry.tag_version(
        record.stable_version, rollout_status="previous_champion", unload_after=unload_after.isoformat()
    )
    record = ctx.record_update(
        record,
        record.with_state(state, now).with_event(
            "promoted",
            now,
            record.stage,
            previous_version=record.stable_version,
            unload_after=unload_after.isoformat(),
            by_hand=by_hand,
        ),
    )
    return {
        "status": "promoted",
        "model_version": version,
        "previous_version": record.stable_version,
        "previous_unload_after": unload_after.isoformat(),
        "routing_revision": routing.revision,
        "excluded_cohorts": list(record.excluded_cohorts),
    }


def retire(settings: Settings, version: int, run_key: str) -> dict[str, Any]:
    """After a promotion's keep window: unload the previous champion, so Triton serves the champion only."""
    ctx = RolloutContext.open(settings)
    record = ctx.owned(run_key, version)
    if record.phase is not Phase.PROMOTED:
        raise Skipped(f"v{version} was not promoted ({record.phase}): nothing to retire")
    if ctx.registry.alias_version(CHAMPION) != version:  # a human rolled back meanwhile: leave serving alone
        raise Skipped(f"v{version} is no longer champion: nothing to retire")
    promoted = next(e for e in record.history if e.kind == "promoted")
    unload_after = promoted.detail["unload_after"]
    if now_utc().isoformat() < unload_after:
        raise StepError(f"v{record.stable_version} stays loaded for instant rollback until {unload_after}")
    serving = ctx.serve_only([version])
    ctx.registry.tag_version(record.stable_version, rollout_status="retired")
    return {"status": f"v{record.stable_version} unloaded", "serving_versions": serving}


def status(settings: Settings) -> dict[str, Any]:
    """Record, routing, MLflow aliases and Triton's loaded versions side by side, with every disagreement named."""
    from mlrelease.serving.reconcile import declared_versions
    from mlrelease.serving.triton_client import TritonClient, TritonUnreachable

    ctx = RolloutContext.open(settings)
    record = ctx.store.read()
    routing = ctx.router.current()
    declared = declared_versions(settings)
    candidates = sorted({*declared, *(routing.serving_versions() if routing else [])})
    client = TritonClient(ctx.router.triton if hasattr(ctx.router, "triton") else triton_url(), timeout=5)
    try:
        loaded: list[int] | None = [v for v in candidates if client.version_ready(MODEL_NAME, v)]
    except TritonUnreachable:
        loaded = None
    finally:
        client.close()
    view = ServingView(
        record, routing, ctx.registry.alias_version(CHAMPION), ctx.registry.alias_version(CHALLENGER), declared, loaded
    )
    problems = disagreements(view)
    pending = None
    if record is not None and record.phase is Phase.ROLLING_BACK:
        pending = f"rollback of v{record.candidate_version} not confirmed yet: `mlrelease step rollback` finishes it"
    return {
        "consistent": not problems,
        "disagreements": problems,
        "pending": pending,
        "rollout": record.model_dump(mode="json") if record else None,
        "routing": routing.__dict__ if routing else None,
        "aliases": {CHAMPION: view.champion, CHALLENGER: view.challenger},
        "triton": {"declared": declared, "loaded": loaded},
        "routing_store": ctx.router.location,
        "metrics_source": ctx.source.location,
    }
