"""Step `answer`: carry out a human's answer to the question a stage asked (the DAG's approval task gives it).

promote: past the stage (the next stage opens next; after the last, the `promote` task makes it champion),
roll back: every cohort to stable (the step then fails, as every rollback of a release does, and the DAG's
rollback task finishes the clean-up), extend: the stage stays open for another maximum exposure, and this step
analyses it, one look per tick, like `analyze`. The answer is recorded first, once (a retried step finds it).
"""

from __future__ import annotations

from typing import Any

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.rollout.answer import Answer, check_question, extended, moved_past, promotion_confirmed, recorded
from mlrelease.rollout.context import RolloutContext
from mlrelease.rollout.machine import Phase, replace
from mlrelease.rollout.store import RolloutRecord, now_utc
from mlrelease.settings import Settings
from mlrelease.steps.rollout.analyze import analyze
from mlrelease.steps.rollout.rollback import rollback_all
from mlrelease.steps.rollout.stage import stage_result


def answer(
    settings: Settings,
    stage: int,
    version: int,
    run_key: str,
    raw_answer: str,
    *,
    tick: bool = False,
    poll_s: float | None = None,
) -> dict[str, Any]:
    """Record the answer to stage `stage`'s question (JSON from the approval task), then carry it out."""
    given = Answer.from_json(raw_answer)
    if given.stage != stage:
        raise StepError(f"--answer is for stage {given.stage}, not for --stage {stage}")
    ctx = RolloutContext.open(settings)
    record = ctx.owned(run_key, version)
    if not recorded(record, given):
        check_question(record, given)
        record = ctx.record_update(record, _carried_out(record, given))
    if given.choice == "rollback":
        if record.active:
            rollback_all(ctx, record, f"stage {stage}: {given.describe()}")
        raise GateFailed(f"rolled back v{version} to v{record.stable_version}: {given.describe()}")
    if given.choice == "promote":
        status = "promote" if stage == len(record.plan.stages) else f"past stage {stage}: the next stage opens next"
        return {**stage_result(record, stage), "status": f"{given.describe()}: {status}", "answer": given.as_detail()}
    if given.question == "confirm_promotion":  # the last stage passed already: looking longer decides nothing new
        _pause(ctx, record, f"the last stage passed; {given.describe()}: it keeps its shares until a human decides")
    result = analyze(settings, stage, version, run_key, tick=tick, poll_s=poll_s)
    if result.get("decided") and result.get("action") == "promote" and _unconfirmed(record):
        _pause(ctx, ctx.owned(run_key, version), "passed after the extension; the plan asks to confirm the promotion")
    return {**result, "answer": given.as_detail()}


def _carried_out(record: RolloutRecord, given: Answer) -> RolloutRecord:
    """The record with the answer in its history and the state it asks for (a rollback is stored by rollback_all)."""
    now = now_utc()
    answered = record.with_event("approval", now, given.stage, **given.as_detail())
    if given.choice == "extend":
        return extended(answered, now)
    if given.choice == "promote" and given.stage < len(record.plan.stages):
        return moved_past(answered)
    return answered


def _unconfirmed(record: RolloutRecord) -> bool:
    return record.plan.approval.confirm_promotion and not promotion_confirmed(record)


def _pause(ctx: RolloutContext, record: RolloutRecord, reason: str) -> None:
    """Pause for a human outside this run (the approval was spent on the extension): rollback_release decides."""
    ctx.record_update(record, replace(record, phase=Phase.PAUSED, reason=reason))
    raise Skipped(f"rollout of v{record.candidate_version} paused: {reason}")
