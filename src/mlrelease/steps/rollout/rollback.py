"""Step `rollback`: everything (stored as `rolling_back` first) or one cohort back to stable, or to a version."""

from __future__ import annotations

from typing import Any

from mlrelease.errors import Skipped, StepError
from mlrelease.registry import CHAMPION
from mlrelease.rollout.context import RolloutContext
from mlrelease.rollout.machine import Action, ActionKind, Phase, apply, next_action
from mlrelease.rollout.store import RolloutRecord, now_utc
from mlrelease.settings import Settings


def rollback_all(ctx: RolloutContext, record: RolloutRecord, reason: str) -> dict[str, Any]:
    """Every cohort back on stable: the request stored (rolling back), traffic moved and confirmed, the record
    rolled back, then the candidate cleaned up. A rollback already under way keeps its first reason; `reason`
    is appended to the history (a `rollback_requested` event), never overwriting it."""
    if record.active:
        record = _request_rollback(ctx, record, reason)
    return finish_rollback(ctx, record)[1]


def _request_rollback(ctx: RolloutContext, record: RolloutRecord, reason: str) -> RolloutRecord:
    """Store a rollback of everything as decided (before any traffic moves), or append `reason` to one under way."""
    now = now_utc()
    requested = record.with_event("rollback_requested", now, record.stage, reason=reason)
    decided = apply(requested, Action(ActionKind.ROLLBACK_ALL, record.stage, reason=reason), record.plan, now)
    return ctx.record_update(record, decided)


def finish_rollback(ctx: RolloutContext, record: RolloutRecord) -> tuple[RolloutRecord, dict[str, Any]]:
    """Complete a decided rollback (a rerun after it routes to stable again), then clean the candidate up."""
    if record.phase is Phase.ROLLING_BACK:
        record = _complete_rollback(ctx, record)
    else:  # rolled back already: the routing write is idempotent, and the cleanup may not have finished
        ctx.route(record, record, record.reason, clear_trips=True)
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
    action = next_action(record, record.plan, record.profile, now_utc(), None)
    assert action.kind is ActionKind.COMPLETE_ROLLBACK, action
    stays = f"the rollout of v{record.candidate_version} stays rolling back ({record.reason})"
    try:
        ctx.route(record, record, record.reason, clear_trips=True)
        routing = ctx.router.current()
    except StepError as exc:
        raise StepError(f"{exc}; {stays}: rerun `mlrelease step rollback` to finish it") from exc
    if routing is None or routing.stable_version != record.stable_version:
        found = "no routing" if routing is None else f"stable v{routing.stable_version}"
        raise StepError(f"routing did not confirm the rollback to v{record.stable_version} (it reads {found}); {stays}")
    if record.candidate_version in routing.serving_versions():
        raise StepError(f"routing still sends traffic to v{record.candidate_version} after the rollback write; {stays}")
    now = now_utc()
    rolled_back = apply(record, action, record.plan, now)
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
    state = record.model_copy(update={"excluded_cohorts": tuple(sorted({*record.excluded_cohorts, cohort}))})
    routing = ctx.route(record, state, reason)
    ctx.record_update(
        record,
        state.with_event("cohort_rolled_back", now, record.stage, cohorts=[cohort], reason=reason),
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
    ctx.registry.set_alias(CHAMPION, target)
    ctx.registry.tag_version(target, rollout_status="restored", rollout_reason=reason[:500])
    return {"status": f"v{target} is champion and serves all traffic", "routing_revision": routing.revision}
