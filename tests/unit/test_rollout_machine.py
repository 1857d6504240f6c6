"""The rollout state machine, ticked through the default plan with a fake clock (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mlrelease.rollout.machine import (
    ActionKind,
    Phase,
    RolloutState,
    apply,
    candidate_percent,
    exposure,
    next_action,
)
from mlrelease.rollout.plan import load_plan
from mlrelease.verdicts.decide import Verdict

PLAN = load_plan()
T0 = datetime(2026, 11, 29, 2, tzinfo=UTC)
PASS = {"high_value": Verdict.PASS, "long_tail": Verdict.PASS, "core": Verdict.PASS}


def _run(verdicts_by_stage, *, profile="demo", max_ticks=50):
    """Tick until nothing is left to do; returns the final state and the actions taken (WAITs skipped)."""
    state, now, taken = RolloutState(candidate_version=2, stable_version=1), T0, []
    for _ in range(max_ticks):
        action = next_action(state, PLAN, profile, now, verdicts_by_stage(state.stage))
        if action.kind is ActionKind.NONE:
            return state, taken
        if action.kind is not ActionKind.WAIT:
            taken.append((action.kind, PLAN.stages[action.stage].name, action.cohorts))
        state = apply(state, action, PLAN, now)
        now += timedelta(seconds=10)
    raise AssertionError(f"no end after {max_ticks} ticks: {state}")


def test_a_good_candidate_goes_through_every_stage_and_is_promoted():
    state, taken = _run(lambda stage: PASS)
    assert state.phase is Phase.PROMOTED
    assert [(k, s) for k, s, _ in taken] == [
        (ActionKind.OPEN_STAGE, "high_value"),
        (ActionKind.ADVANCE, "high_value"),
        (ActionKind.OPEN_STAGE, "long_tail"),
        (ActionKind.ADVANCE, "long_tail"),
        (ActionKind.OPEN_STAGE, "everyone"),
        (ActionKind.PROMOTE, "everyone"),
    ]
    assert candidate_percent(state, PLAN) == {"*": 100.0}


def test_a_long_tail_breach_rolls_back_that_cohort_only_and_continues():
    tail_fails = {**PASS, "long_tail": Verdict.FAIL}
    state, taken = _run(lambda stage: tail_fails if stage == 1 else PASS)
    assert (ActionKind.ROLLBACK_COHORT, "long_tail", ("long_tail",)) in taken
    assert (ActionKind.OPEN_STAGE, "everyone", ()) in taken  # the other cohorts carry on
    assert state.excluded_cohorts == ("long_tail",)
    assert state.phase is Phase.PAUSED and "long_tail was rolled back" in state.reason  # never promoted silently


def test_a_breach_in_the_first_stage_rolls_everything_back():
    state, taken = _run(lambda stage: {**PASS, "high_value": Verdict.FAIL})
    assert taken[-1][0] is ActionKind.ROLLBACK_ALL and state.phase is Phase.ROLLED_BACK
    assert "guardrails failed for high_value" in state.reason
    assert candidate_percent(state, PLAN) == {}


def test_a_breach_on_everyone_cannot_be_a_cohort_rollback():
    state = RolloutState(candidate_version=2, stable_version=1, stage=2, stage_opened_at=T0)
    later = T0 + timedelta(hours=25)
    action = next_action(state, PLAN, "production", later, {**PASS, "core": Verdict.FAIL})
    assert action.kind is ActionKind.ROLLBACK_ALL


def test_a_pass_waits_for_the_minimum_exposure_and_a_fail_acts_at_once():
    opened = RolloutState(candidate_version=2, stable_version=1, stage_opened_at=T0)
    early = T0 + timedelta(minutes=5)  # production minimum exposure: 30 minutes
    assert next_action(opened, PLAN, "production", early, PASS).kind is ActionKind.WAIT
    assert next_action(opened, PLAN, "production", early, None).kind is ActionKind.WAIT
    failed = next_action(opened, PLAN, "production", early, {**PASS, "high_value": Verdict.FAIL})
    assert failed.kind is ActionKind.ROLLBACK_ALL
    assert next_action(opened, PLAN, "production", T0 + timedelta(minutes=31), PASS).kind is ActionKind.ADVANCE


def test_an_open_question_continues_and_an_inconclusive_one_pauses():
    opened = RolloutState(candidate_version=2, stable_version=1, stage_opened_at=T0)
    open_ = {**PASS, "high_value": Verdict.CONTINUE}
    waiting = next_action(opened, PLAN, "demo", T0 + timedelta(seconds=45), open_)
    assert waiting.kind is ActionKind.WAIT and "high_value not decided yet" in waiting.reason
    assert exposure(opened, PLAN, "demo", T0 + timedelta(seconds=29)) == (False, False)
    assert exposure(opened, PLAN, "demo", T0 + timedelta(seconds=89)) == (True, False)
    assert exposure(opened, PLAN, "demo", T0 + timedelta(seconds=90)) == (True, True)
    # at the maximum exposure the analysis turned open questions into the plan's on_inconclusive
    thin = {**PASS, "high_value": Verdict.INCONCLUSIVE}
    paused = next_action(opened, PLAN, "demo", T0 + timedelta(seconds=91), thin)
    assert paused.kind is ActionKind.PAUSE and "inconclusive" in paused.reason


def test_deciding_is_pure_and_a_rerun_decides_the_same():
    state = RolloutState(candidate_version=2, stable_version=1, stage=1, stage_opened_at=T0)
    now, verdicts = T0 + timedelta(hours=2), {**PASS, "long_tail": Verdict.FAIL}
    first = next_action(state, PLAN, "production", now, verdicts)
    assert first == next_action(state, PLAN, "production", now, verdicts)
    after = apply(state, first, PLAN, now)
    assert after == apply(state, first, PLAN, now)
    assert candidate_percent(after, PLAN) == {"*": 95, "long_tail": 0.0}


def test_a_pooled_breach_rolls_everything_back_even_in_a_cohort_rollback_stage():
    state = RolloutState(candidate_version=2, stable_version=1, stage=1, stage_opened_at=T0)
    action = next_action(
        state, PLAN, "demo", T0 + timedelta(seconds=40), {"*": Verdict.FAIL, "long_tail": Verdict.PASS}
    )
    assert action.kind is ActionKind.ROLLBACK_ALL and action.cohorts == ("*",)
