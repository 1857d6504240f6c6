"""Steps `promote` and `retire`: all traffic to the candidate, then the `champion` alias; the old one unloaded."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.registry import CHALLENGER, CHAMPION
from mlrelease.rollout.answer import passed_last_stage, promotion_confirmed
from mlrelease.rollout.context import RolloutContext
from mlrelease.rollout.machine import Action, ActionKind, Phase, apply
from mlrelease.rollout.store import now_utc
from mlrelease.settings import Settings
from mlrelease.steps.rollout.stage import checked_gates


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
    overridden = checked_gates(ctx, version, "promote", override_gates)
    if overridden is not None:
        record = ctx.record_update(record, record.with_event("gates_overridden", now_utc(), record.stage, **overridden))
    passed = passed_last_stage(record)
    confirmed = promotion_confirmed(record)  # a human answered `promote` to the last stage's question in the run
    by_hand = by_hand or (confirmed and record.phase is Phase.PAUSED)
    if not passed and not (by_hand and record.phase is Phase.PAUSED):
        raise StepError(f"v{version} has not passed the last stage's analysis: refusing to promote an unchecked model")
    if record.plan.approval.confirm_promotion and not (confirmed or by_hand):
        raise StepError(f"the plan asks a human to confirm the promotion of v{version}, and nobody has")
    now = now_utc()
    state = apply(record, Action(ActionKind.PROMOTE, record.stage, reason="promoted"), record.plan, now)
    routing = ctx.route(record, state, "promote")  # traffic first; the alias is the commit point
    ctx.registry.set_alias(CHAMPION, version)
    ctx.registry.clear_alias(CHALLENGER, if_version=version)
    unload_after = now + timedelta(seconds=record.plan.keep_previous_s[record.profile])
    ctx.registry.tag_version(version, rollout_status="promoted_by_hand" if by_hand else "promoted")
    ctx.registry.tag_version(
        record.stable_version, rollout_status="previous_champion", unload_after=unload_after.isoformat()
    )
    record = ctx.record_update(
        record,
        state.with_event(
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
