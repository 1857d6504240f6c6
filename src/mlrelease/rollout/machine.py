"""The rollout state machine: a durable state, and a pure `next_action` that advances it one step per tick.

The DAG (or an operator) calls `next_action(state, plan, …)` with the latest guardrail verdicts, performs
the action (open a stage in the routing state, roll back, promote…), and stores `apply(state, action)`.
Because the decision is pure and the state is stored after each step, a crashed task resumes from the
stored state and a rerun of the same tick decides the same thing.

A rollback of everything takes two ticks, so the record never runs ahead of routing: `ROLLBACK_ALL` stores
the decision (phase ROLLING_BACK, with its reason; traffic may still reach the candidate), and from there
every tick answers `COMPLETE_ROLLBACK` until the caller has routed everything to stable, read the routing
back, and stored `apply(state, COMPLETE_ROLLBACK)` (phase ROLLED_BACK).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from mlrelease.rollout.plan import Profile, RolloutPlan
from mlrelease.verdicts.decide import Verdict


class Phase(StrEnum):
    """Where a rollout is."""

    STAGE = "stage"
    PAUSED = "paused"
    ROLLING_BACK = "rolling_back"  # decided; rolled back once routing is confirmed on stable
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


class ActionKind(StrEnum):
    """What the next tick must do."""

    OPEN_STAGE = "open_stage"
    WAIT = "wait"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ROLLBACK_COHORT = "rollback_cohort"
    ROLLBACK_ALL = "rollback_all"
    COMPLETE_ROLLBACK = "complete_rollback"
    PAUSE = "pause"
    NONE = "none"


class RolloutState(BaseModel):
    """One candidate's rollout: its phase, the current stage and since when, and cohorts taken back.

    The stored record (`rollout/store.py`'s `RolloutRecord`) *is* this state, with its owner, plan and history added:
    one type, so `apply` on a record returns the next record and no field is copied between two shapes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidate_version: int
    stable_version: int
    phase: Phase = Phase.STAGE
    stage: int = Field(1, ge=1, description="the plan's stage it is at, counted from 1 (as everywhere)")
    stage_opened_at: datetime | None = None
    excluded_cohorts: tuple[str, ...] = ()
    reason: str = ""
    started_at: datetime | None = None  # when the rollout began: what came before is the pre-rollout baseline
    baseline_since: datetime | None = None  # … but not before this (the previous rollout of the model ended)
    finished_at: datetime | None = None  # when it was promoted or rolled back
    extended_s: float = Field(0.0, ge=0, description="added to the open stage's maximum exposure by a human's answer")


State = TypeVar("State", bound=RolloutState)


@dataclass(frozen=True)
class Action:
    """The decision of one tick; `cohorts` for a cohort rollback, `reason` for humans and alerts."""

    kind: ActionKind
    stage: int
    cohorts: tuple[str, ...] = ()
    reason: str = ""


def next_action(
    state: RolloutState, plan: RolloutPlan, profile: Profile, now: datetime, verdicts: dict[str, Verdict] | None
) -> Action:
    """Decide the next step from the state, the plan, the clock and the latest per-cohort verdicts (pure).

    A fail acts at once, whatever the exposure; a stage advances as soon as every judged cohort passed,
    but not before its minimum exposure; at its maximum exposure the analysis has already turned every
    open question into what the plan says (`on_inconclusive`), and an inconclusive verdict pauses.
    A decided rollback is resumed by every tick until routing confirmed it.
    """
    if state.phase is not Phase.STAGE:
        return _outside_a_stage(state)
    stage = plan.stage(state.stage)
    if state.stage_opened_at is None:
        return Action(ActionKind.OPEN_STAGE, state.stage, reason=f"open stage {stage.name}")
    elapsed = (now - state.stage_opened_at).total_seconds()
    if verdicts is None:
        return Action(ActionKind.WAIT, state.stage, reason=f"stage {stage.name}: waiting for analysis")
    judged = {c: v for c, v in verdicts.items() if c not in state.excluded_cohorts}
    failed = tuple(sorted(c for c, v in judged.items() if v is Verdict.FAIL))
    if failed:
        return _on_breach(state, plan, failed)
    minimum, maximum = stage.min_exposure_s[profile], stage.max_exposure_s[profile] + state.extended_s
    if elapsed < minimum:
        return Action(ActionKind.WAIT, state.stage, reason=f"stage {stage.name}: {elapsed:.0f}/{minimum:.0f} s exposed")
    if any(v is Verdict.INCONCLUSIVE for v in judged.values()):
        return Action(
            ActionKind.PAUSE, state.stage, reason=f"stage {stage.name}: still inconclusive after {elapsed:.0f} s"
        )
    if any(v is Verdict.CONTINUE for v in judged.values()):
        open_ = ", ".join(sorted(c for c, v in judged.items() if v is Verdict.CONTINUE))
        return Action(
            ActionKind.WAIT,
            state.stage,
            reason=f"stage {stage.name}: {open_} not decided yet ({elapsed:.0f}/{maximum:.0f} s)",
        )
    if state.stage == len(plan.stages):
        if state.excluded_cohorts:  # one champion alias cannot serve some cohorts only: a human decides
            held = ", ".join(state.excluded_cohorts)
            return Action(ActionKind.PAUSE, state.stage, reason=f"passed, but {held} was rolled back: promote by hand")
        return Action(ActionKind.PROMOTE, state.stage, reason="every stage passed")
    return Action(ActionKind.ADVANCE, state.stage, reason=f"stage {stage.name} passed")


def _outside_a_stage(state: RolloutState) -> Action:
    """Rolling back: finish it (every tick resumes it until routing confirmed it); otherwise nothing to do."""
    if state.phase is Phase.ROLLING_BACK:
        return Action(ActionKind.COMPLETE_ROLLBACK, state.stage, reason=state.reason)
    return Action(ActionKind.NONE, state.stage, reason=f"rollout is {state.phase}")


def exposure(state: RolloutState, plan: RolloutPlan, profile: Profile, now: datetime) -> tuple[bool, bool]:
    """Whether the open stage is past its minimum exposure, and whether it reached its maximum."""
    if state.stage_opened_at is None or state.phase is not Phase.STAGE:
        return False, False
    stage, elapsed = plan.stage(state.stage), (now - state.stage_opened_at).total_seconds()
    return elapsed >= stage.min_exposure_s[profile], elapsed >= stage.max_exposure_s[profile] + state.extended_s


def _on_breach(state: RolloutState, plan: RolloutPlan, failed: tuple[str, ...]) -> Action:
    stage = plan.stage(state.stage)
    reason = f"stage {stage.name}: guardrails failed for {', '.join(failed)}"
    if stage.on_breach == "pause":
        return Action(ActionKind.PAUSE, state.stage, failed, reason)
    # Taking one cohort back only makes sense while other cohorts stay on the candidate.
    # A pooled verdict ('*') belongs to no single cohort: only a rollback of everything undoes it.
    whole = "*" in stage.candidate_percent or "*" in failed or set(failed) >= set(stage.candidate_percent)
    if stage.on_breach == "rollback_cohort" and not whole:
        return Action(ActionKind.ROLLBACK_COHORT, state.stage, failed, reason)
    return Action(ActionKind.ROLLBACK_ALL, state.stage, failed, reason)


def apply(state: State, action: Action, plan: RolloutPlan, now: datetime) -> State:
    """The state after `action` was carried out (pure; store the result, then the next tick reads it). A record in,
    the next record out: its other fields stay as they are.

    `ROLLBACK_ALL` is stored before traffic moves (rolling back; a rollback already under way keeps its first
    reason), `COMPLETE_ROLLBACK` only after routing was confirmed on stable.
    """
    after = _after(state, action, plan, now)
    if after.phase in (Phase.PROMOTED, Phase.ROLLED_BACK) and after.finished_at is None:
        return replace(after, finished_at=now)
    return after


def replace(state: State, **changes: Any) -> State:
    """`state` with `changes` (a frozen model's copy; the values are the machine's own, already valid)."""
    return state.model_copy(update=changes)


def _after(state: State, action: Action, plan: RolloutPlan, now: datetime) -> State:
    kind = action.kind
    if kind is ActionKind.ROLLBACK_ALL:
        if state.phase is Phase.ROLLING_BACK:
            return state
        return replace(state, phase=Phase.ROLLING_BACK, reason=action.reason)
    if kind is ActionKind.COMPLETE_ROLLBACK:
        return replace(state, phase=Phase.ROLLED_BACK) if state.phase is Phase.ROLLING_BACK else state
    if kind is ActionKind.OPEN_STAGE:
        return replace(state, stage_opened_at=now, started_at=state.started_at or now)
    if kind is ActionKind.ADVANCE:
        return replace(state, stage=state.stage + 1, stage_opened_at=None, extended_s=0.0)
    if kind is ActionKind.ROLLBACK_COHORT:
        excluded = tuple(sorted({*state.excluded_cohorts, *action.cohorts}))
        if state.stage == len(plan.stages):  # promotion with a cohort held back needs a human decision
            return replace(state, excluded_cohorts=excluded, phase=Phase.PAUSED, reason=action.reason)
        return replace(state, excluded_cohorts=excluded, stage=state.stage + 1, stage_opened_at=None, extended_s=0.0)
    terminal = {ActionKind.PROMOTE: Phase.PROMOTED, ActionKind.PAUSE: Phase.PAUSED}
    if kind in terminal:
        return replace(state, phase=terminal[kind], reason=action.reason)
    return state


def candidate_percent(state: RolloutState, plan: RolloutPlan) -> dict[str, float]:
    """The candidate's share per cohort that the current stage means, with rolled-back cohorts at 0."""
    if state.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK):
        return {}
    if state.phase is Phase.PROMOTED:
        return {"*": 100.0}
    shares = dict(plan.stage(state.stage).candidate_percent)
    shares.update({cohort: 0.0 for cohort in state.excluded_cohorts})
    return shares
