"""The rollout state machine, ticked through the default plan with a fake clock (pure), and the rollback steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mlrelease.errors import GateFailed, StepError
from mlrelease.rollout.consistency import ServingView, disagreements
from mlrelease.rollout.machine import (
    Action,
    ActionKind,
    Phase,
    RolloutState,
    apply,
    candidate_percent,
    exposure,
    next_action,
)
from mlrelease.rollout.outage import CallTimeline
from mlrelease.rollout.plan import load_plan
from mlrelease.rollout.store import RolloutBusy, RolloutStore
from mlrelease.settings import Settings
from mlrelease.steps import rollout as steps
from mlrelease.steps.rollout import stage as stage_step
from mlrelease.verdicts.decide import Verdict
from tests.unit.arms import arm_window
from tests.unit.records import FakeRouter, rollout_record

PLAN = load_plan().allocated(("high_value", "long_tail", "core"))
T0 = datetime(2026, 11, 29, 2, tzinfo=UTC)
PASS = {"high_value": Verdict.PASS, "long_tail": Verdict.PASS, "core": Verdict.PASS}
KEY = rollout_record().run_key


def _run(verdicts_by_stage, *, profile="demo", max_ticks=50):
    """Tick until nothing is left to do; returns the final state and the actions taken (WAITs skipped)."""
    state, now, taken = RolloutState(candidate_version=2, stable_version=1), T0, []
    for _ in range(max_ticks):
        action = next_action(state, PLAN, profile, now, verdicts_by_stage(state.stage))
        if action.kind is ActionKind.NONE:
            return state, taken
        if action.kind is not ActionKind.WAIT:
            taken.append((action.kind, PLAN.stage(action.stage).name, action.cohorts))
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
    state, taken = _run(lambda stage: tail_fails if stage == 2 else PASS)
    assert (ActionKind.ROLLBACK_COHORT, "long_tail", ("long_tail",)) in taken
    assert (ActionKind.OPEN_STAGE, "everyone", ()) in taken  # the other cohorts carry on
    assert state.excluded_cohorts == ("long_tail",)
    assert state.phase is Phase.PAUSED and "long_tail was rolled back" in state.reason  # never promoted silently


def test_a_breach_in_the_first_stage_rolls_everything_back():
    state, taken = _run(lambda stage: {**PASS, "high_value": Verdict.FAIL})
    # decided (rolling back), then completed once routing confirmed it: two ticks, the record never ahead
    assert [k for k, _, _ in taken[-2:]] == [ActionKind.ROLLBACK_ALL, ActionKind.COMPLETE_ROLLBACK]
    assert state.phase is Phase.ROLLED_BACK
    assert "guardrails failed for high_value" in state.reason
    assert candidate_percent(state, PLAN) == {}


def test_a_decided_rollback_is_rolling_back_until_completed_and_keeps_its_first_reason():
    opened = RolloutState(candidate_version=2, stable_version=1, stage_opened_at=T0)
    now = T0 + timedelta(seconds=5)
    decided = next_action(opened, PLAN, "demo", now, {**PASS, "high_value": Verdict.FAIL})
    rolling = apply(opened, decided, PLAN, now)
    assert rolling.phase is Phase.ROLLING_BACK and "guardrails failed for high_value" in rolling.reason
    assert candidate_percent(rolling, PLAN) == {}  # what routing must become: nothing on the candidate
    # every later tick resumes it, whatever the verdicts say (a pass cannot undo a decided rollback)
    for verdicts in (None, PASS):
        resume = next_action(rolling, PLAN, "demo", now + timedelta(seconds=60), verdicts)
        assert resume.kind is ActionKind.COMPLETE_ROLLBACK and resume.reason == rolling.reason
    # a second request (a person, a retry) does not overwrite the first reason
    again = apply(rolling, Action(ActionKind.ROLLBACK_ALL, 1, reason="manual rollback"), PLAN, now)
    assert again == rolling
    done = apply(rolling, resume, PLAN, now)
    assert done.phase is Phase.ROLLED_BACK and done.reason == rolling.reason
    assert next_action(done, PLAN, "demo", now, None).kind is ActionKind.NONE
    # completing applies only to a rollback under way
    assert apply(opened, resume, PLAN, now) == opened


def test_a_breach_on_everyone_cannot_be_a_cohort_rollback():
    state = RolloutState(candidate_version=2, stable_version=1, stage=3, stage_opened_at=T0)
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
    state = RolloutState(candidate_version=2, stable_version=1, stage=2, stage_opened_at=T0)
    now, verdicts = T0 + timedelta(hours=2), {**PASS, "long_tail": Verdict.FAIL}
    first = next_action(state, PLAN, "production", now, verdicts)
    assert first == next_action(state, PLAN, "production", now, verdicts)
    after = apply(state, first, PLAN, now)
    assert after == apply(state, first, PLAN, now)
    assert candidate_percent(after, PLAN) == {"*": 95, "long_tail": 0.0}


def test_a_pooled_breach_rolls_everything_back_even_in_a_cohort_rollback_stage():
    state = RolloutState(candidate_version=2, stable_version=1, stage=2, stage_opened_at=T0)
    action = next_action(
        state, PLAN, "demo", T0 + timedelta(seconds=40), {"*": Verdict.FAIL, "long_tail": Verdict.PASS}
    )
    assert action.kind is ActionKind.ROLLBACK_ALL and action.cohorts == ("*",)


# The rollback steps, against the real record store and a fake router that notes what the record said
# when traffic moved.


class FailingSource:
    """A stage whose candidate fails a fifth of its calls, with calls all through the window."""

    location = "fake"

    def windows(self, since, until, exclude=()):
        def arm(errors):
            return arm_window(2000, errors=errors, rng=np.random.default_rng(0))

        return {("high_value", 2): arm(400), ("high_value", 1): arm(0), ("*", 2): arm(400), ("*", 1): arm(0)}

    def timeline(self, since, until, stable):
        return CallTimeline.from_times(since, until, np.arange(since.timestamp(), until.timestamp(), 0.5))

    def features(self, cohort, since, until):
        return np.zeros((0, 14))


@pytest.fixture
def stage_one(tmp_path, monkeypatch):
    """Stage 1 of v2 opened a few seconds ago, every rollout step wired to a fake router and source."""
    from mlrelease.rollout import context

    store = RolloutStore(tmp_path, "parcel_eta")
    opened = datetime.now(UTC) - timedelta(seconds=5)
    store.update(lambda _: rollout_record().model_copy(update={"stage_opened_at": opened}))
    settings = Settings.from_env()  # metrics source `decision_log`, as FakeRouter's observed_by
    ctx = context.RolloutContext(settings, store, FakeRouter(store), FailingSource(), None, ("high_value", "long_tail"))
    ctx.retire_candidate = lambda record, reason: {"retired_for": reason}  # no Triton, no MLflow here
    monkeypatch.setattr(context.RolloutContext, "open", classmethod(lambda cls, settings: ctx))
    return ctx


def test_a_rollback_verdict_is_stored_as_rolling_back_before_traffic_moves(stage_one):
    with pytest.raises(GateFailed, match="rolled back v2 to v1"):
        steps.analyze(None, 1, 2, KEY)
    record = stage_one.store.read()
    assert stage_one.router.record_said == [Phase.ROLLING_BACK]  # the decision first, then traffic …
    assert record.phase is Phase.ROLLED_BACK and record.finished_at is not None  # … then the record
    assert [e.kind for e in record.history] == ["analysis", "rolled_back"]
    assert record.reason.startswith("stage high_value: guardrails failed for high_value")
    assert stage_one.router.routing.serving_versions() == [1]


def test_a_failed_routing_stays_rolling_back_and_a_retry_finishes_it_with_the_first_reason(stage_one, monkeypatch):
    stage_one.router.failing = "parcel_eta version(s) [1] are not ready on Triton; load them first"
    with pytest.raises(StepError, match="stays rolling back"):
        steps.analyze(None, 1, 2, KEY)
    record = stage_one.store.read()
    verdict = record.reason
    assert record.phase is Phase.ROLLING_BACK and record.finished_at is None and record.active
    assert verdict.startswith("stage high_value: guardrails failed")
    view = ServingView(record, stage_one.router.routing, 1, 2, [1, 2], [1, 2])
    assert "rolling back: routing still sends traffic to v2" in disagreements(view)
    # while it rolls back, no stage opens and nothing is promoted (the version's gates passed: not the question)
    monkeypatch.setattr(stage_step, "checked_gates", lambda *args: None)
    with pytest.raises(GateFailed, match="is being rolled back"):
        steps.rollout_stage(None, 2, 2, KEY, profile="demo")
    with pytest.raises(GateFailed, match="cannot be promoted"):
        steps.promote(None, 2, KEY)
    stage_one.router.failing = ""
    done = steps.rollback(None, KEY, reason="on-call: Triton is back")
    record = stage_one.store.read()
    assert record.phase is Phase.ROLLED_BACK and record.reason == verdict == done["reason"]  # never overwritten
    assert [e.kind for e in record.history] == ["analysis", "rollback_requested", "rolled_back"]
    assert record.history[1].detail["reason"] == "on-call: Triton is back"  # appended as history
    assert done["retired_for"] == verdict  # the version's tag quotes the verdict too
    assert disagreements(ServingView(record, stage_one.router.routing, 1, None, [1], [1])) == []


def test_a_manual_rollback_whose_routing_failed_is_finished_by_the_next_analyze_tick(stage_one):
    stage_one.router.failing = "routing store unreachable"
    with pytest.raises(StepError, match="stays rolling back"):
        steps.rollback(None, KEY, reason="abort: wrong model")
    assert stage_one.store.read().phase is Phase.ROLLING_BACK
    stage_one.router.failing = ""
    with pytest.raises(GateFailed, match="rolled back v2 to v1: abort: wrong model"):
        steps.analyze(None, 1, 2, KEY)  # resumes the decided rollback instead of judging the stage again
    record = stage_one.store.read()
    assert record.phase is Phase.ROLLED_BACK and record.reason == "abort: wrong model"
    assert [e.kind for e in record.history] == ["rollback_requested", "rolled_back"]
    assert stage_one.router.record_said == [Phase.ROLLING_BACK, Phase.ROLLING_BACK]


def test_a_rolling_back_rollout_still_holds_the_model(tmp_path):
    store = RolloutStore(tmp_path, "parcel_eta")
    store.update(lambda _: rollout_record(Phase.ROLLING_BACK))
    with pytest.raises(RolloutBusy, match="phase rolling_back"):
        store.begin(rollout_record().model_copy(update={"run_key": "20261130T020000Z", "candidate_version": 3}))
    assert not (tmp_path / "history").exists()  # archived only once finished


def test_the_pre_rollout_baseline_ends_when_the_rollout_began_and_starts_after_the_previous_one_ended():
    from mlrelease.rollout.tick import baseline_window

    plan = load_plan()
    began = T0 + timedelta(hours=3)
    state = RolloutState(candidate_version=2, stable_version=1, started_at=began)
    assert baseline_window(state, plan, "production") == (began - timedelta(hours=2), began)
    # the previous rollout's candidate held the same buckets until an hour ago: the window starts then
    after = state.model_copy(update={"baseline_since": began - timedelta(hours=1)})
    assert baseline_window(after, plan, "production") == (began - timedelta(hours=1), began)
    assert baseline_window(state.model_copy(update={"baseline_since": began}), plan, "production") is None
    no_start = state.model_copy(update={"started_at": None})
    assert baseline_window(no_start, plan, "production") is None  # no start: no covariate
