"""A human's answer to a stage's question: parsing it, what each choice does to the record and to traffic, the
promotion it confirms, and the approval task that asks (its evidence, its timeout and default, its answer)."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.rollout import answer as answers
from mlrelease.rollout.machine import Phase, exposure
from mlrelease.rollout.outage import CallTimeline
from mlrelease.rollout.plan import Approval
from mlrelease.rollout.store import RolloutStore
from mlrelease.settings import Settings
from mlrelease.steps import rollout as steps
from tests.unit.arms import arm_window
from tests.unit.records import FakeRouter, rollout_record

KEY = rollout_record().run_key
# The module, not the step function the package exports under the same name.
promote_step = importlib.import_module("mlrelease.steps.rollout.promote")
NOW = datetime.now(UTC)


def said(choice: str, *, stage: int = 1, by: str | None = "alice", question: str = "pause", at: datetime = NOW) -> str:
    """The approval task's answer, as answer_N receives it."""
    return json.dumps({"stage": stage, "question": question, "choice": choice, "at": at.isoformat(), "by": by})


class Registry:
    """The MLflow aliases and tags the promotion moves, in memory."""

    def __init__(self) -> None:
        self.aliases: dict[str, int] = {"champion": 1, "challenger": 2}
        self.tags: dict[int, dict[str, str]] = {}

    def set_alias(self, alias: str, version: int) -> None:
        self.aliases[alias] = version

    def clear_alias(self, alias: str, if_version: int | None = None) -> None:
        self.aliases.pop(alias, None)

    def tag_version(self, version: int, **tags: str) -> None:
        self.tags.setdefault(version, {}).update(tags)


class SlowSource:
    """The candidate's calls twice as slow as stable's, every cohort, calls all through the window."""

    location = "fake"

    def windows(self, since, until, exclude=()):
        rng = np.random.default_rng(0)
        slow, fast = arm_window(2000, latency=0.2, rng=rng), arm_window(2000, latency=0.1, rng=rng)
        return {(c, v): slow if v == 2 else fast for c in ("high_value", "long_tail", "core") for v in (1, 2)}

    def timeline(self, since, until, stable):
        return CallTimeline.from_times(since, until, np.arange(since.timestamp(), until.timestamp(), 0.5))

    def features(self, cohort, since, until):
        return np.zeros((0, 14))


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """v2's rollout paused at stage 1 (its window open long past the maximum exposure), steps on fakes."""
    from mlrelease.rollout import context

    store = RolloutStore(tmp_path, "parcel_eta")
    opened = NOW - timedelta(seconds=600)
    store.update(
        lambda _: rollout_record(Phase.PAUSED).model_copy(
            update={"stage_opened_at": opened, "reason": "stage high_value: still inconclusive after 90 s"}
        )
    )
    ctx = context.RolloutContext(
        Settings.from_env(), store, FakeRouter(store), SlowSource(), Registry(), ("high_value", "long_tail", "core")
    )
    ctx.retire_candidate = lambda record, reason: {"retired_for": reason}  # no Triton here
    monkeypatch.setattr(context.RolloutContext, "open", classmethod(lambda cls, settings: ctx))
    monkeypatch.setattr(promote_step, "checked_gates", lambda *args: None)  # the version's gates passed
    return ctx


def test_an_answer_names_what_is_wrong_with_it():
    with pytest.raises(StepError, match=r"chose 'ship it'; the options are extend, promote, rollback"):
        answers.Answer.from_json(said("ship it"))
    with pytest.raises(StepError, match="not JSON"):
        answers.Answer.from_json("{'choice': 'promote'}")
    with pytest.raises(StepError, match="no UTC offset"):
        answers.Answer.from_json(said("promote", at=datetime(2026, 11, 29, 5)))
    with pytest.raises(StepError, match="answers 'why'"):
        answers.Answer.from_json(said("promote", question="why"))
    with pytest.raises(StepError, match="must be the approval task's answer object"):
        answers.Answer.from_json("null")  # what xcom_pull renders when the approval task pushed nothing


def test_promote_before_the_last_stage_moves_past_it_and_records_who_answered(paused):
    done = steps.answer(None, 1, 2, KEY, said("promote"))
    record = paused.store.read()
    assert record.phase is Phase.STAGE and record.stage == 2 and record.stage_opened_at is None and not record.reason
    (event,) = [e for e in record.history if e.kind == "approval"]
    assert event.stage == 1 and event.detail["choice"] == "promote" and event.detail["by"] == "alice"
    assert not event.detail["timed_out"] and done["answer"]["by"] == "alice"
    assert paused.router.record_said == []  # no traffic moved: the next stage's rollout-stage routes it
    again = steps.answer(None, 1, 2, KEY, said("promote"))  # a retried task records the answer once
    assert [e.kind for e in paused.store.read().history] == ["approval"] and again["stage"] == 1


def test_roll_back_takes_every_cohort_back_and_fails_the_step_like_any_rollback(paused):
    with pytest.raises(GateFailed, match="rolled back v2 to v1: roll back, answered by bob"):
        steps.answer(None, 1, 2, KEY, said("rollback", by="bob"))
    record = paused.store.read()
    assert record.phase is Phase.ROLLED_BACK and paused.router.routing.serving_versions() == [1]
    assert [e.kind for e in record.history] == ["approval", "rollback_requested", "rolled_back"]
    assert record.reason == "stage 1: roll back, answered by bob"
    assert paused.router.record_said == [Phase.ROLLING_BACK]  # stored as decided before traffic moved


def test_nobody_answering_takes_the_default_and_says_so(paused):
    with pytest.raises(GateFailed, match=r"roll back \(nobody answered in time: the default\)"):
        steps.answer(None, 1, 2, KEY, said("rollback", by=None))
    (event,) = [e for e in paused.store.read().history if e.kind == "approval"]
    assert event.detail["timed_out"] and event.detail["by"] is None


def test_extend_reopens_the_stage_for_another_maximum_exposure_and_judges_it_again(paused):
    record = paused.store.read()
    maximum = record.plan.stage(1).max_exposure_s["demo"]
    reopened = answers.extended(record, NOW)
    assert reopened.phase is Phase.STAGE and exposure(reopened, reopened.plan, "demo", NOW) == (True, False)
    deadline = NOW + timedelta(seconds=maximum)
    assert exposure(reopened, reopened.plan, "demo", deadline - timedelta(seconds=1))[1] is False
    assert exposure(reopened, reopened.plan, "demo", deadline + timedelta(seconds=1))[1] is True
    # The step carries it out: the stage is judged again at once, and the slow candidate's latency fails.
    with pytest.raises(GateFailed, match="latency"):
        steps.answer(None, 1, 2, KEY, said("extend"))
    record = paused.store.read()
    assert record.phase is Phase.ROLLED_BACK and [e.kind for e in record.history][:2] == ["approval", "analysis"]


def test_an_answer_to_a_question_the_rollout_is_not_asking_is_refused(paused):
    with pytest.raises(StepError, match="--answer is for stage 2, not for --stage 1"):
        steps.answer(None, 1, 2, KEY, said("promote", stage=2))
    steps.answer(None, 1, 2, KEY, said("promote"))
    with pytest.raises(StepError, match="the answer is to a pause, but the rollout of v2 is stage"):
        steps.answer(None, 2, 2, KEY, said("rollback", stage=2, at=NOW + timedelta(seconds=1)))
    assert paused.router.record_said == []  # nothing moved on a refused answer


def _at_last_stage(ctx, *, phase: Phase, passed: bool, confirm: bool = False) -> None:
    record = ctx.store.read()
    plan = record.plan.model_copy(update={"approval": Approval(confirm_promotion=confirm)})
    last = len(plan.stages)
    at_last = record.model_copy(update={"plan": plan, "stage": last, "phase": phase})
    if passed:
        at_last = at_last.with_event("analysis", NOW, last, action="promote", reason="every stage passed")
    ctx.store.update(lambda _: at_last)


def test_a_paused_last_stage_promoted_by_a_human_becomes_champion(paused):
    _at_last_stage(paused, phase=Phase.PAUSED, passed=False)
    with pytest.raises(StepError, match="has not passed the last stage's analysis"):
        steps.promote(None, 2, KEY)  # nobody answered yet
    steps.answer(None, 3, 2, KEY, said("promote", stage=3))
    done = steps.promote(None, 2, KEY)
    assert done["status"] == "promoted" and paused.registry.aliases == {"champion": 2}
    record = paused.store.read()
    assert record.phase is Phase.PROMOTED and record.history[-1].detail["by_hand"] is True
    assert paused.registry.tags[2]["rollout_status"] == "promoted_by_hand"


def test_confirm_promotion_holds_a_passed_rollout_until_a_human_confirms(paused):
    _at_last_stage(paused, phase=Phase.STAGE, passed=True, confirm=True)
    record = paused.store.read()
    asked = answers.question(record, 3, "promote", "every stage passed")
    assert asked is not None and asked["question"] == "confirm_promotion" and asked["default"] == "Roll back"
    with pytest.raises(StepError, match="asks a human to confirm the promotion of v2, and nobody has"):
        steps.promote(None, 2, KEY)
    steps.answer(None, 3, 2, KEY, said("promote", stage=3, question="confirm_promotion"))
    assert steps.promote(None, 2, KEY)["status"] == "promoted"
    assert paused.registry.tags[2]["rollout_status"] == "promoted"  # every stage passed: not by hand


def test_extending_a_passed_last_stage_keeps_its_shares_paused_for_a_human(paused):
    _at_last_stage(paused, phase=Phase.STAGE, passed=True, confirm=True)
    kept = "the last stage passed; extend the stage, answered by alice: it keeps its shares"
    with pytest.raises(Skipped, match=kept):
        steps.answer(None, 3, 2, KEY, said("extend", stage=3, question="confirm_promotion"))
    record = paused.store.read()
    assert record.phase is Phase.PAUSED and paused.router.record_said == []  # nothing moved
    with pytest.raises(StepError, match="nobody has"):
        steps.promote(None, 2, KEY)  # still unconfirmed: rollback_release's promote_paused decides


def test_the_question_follows_the_plan_and_nothing_is_asked_of_a_decided_stage():
    record = rollout_record(Phase.PAUSED).model_copy(update={"reason": "stage high_value: still inconclusive"})
    asked = answers.question(record, 1, "pause", "")
    assert asked == {
        "question": "pause",
        "stage": 1,
        "reason": "stage high_value: still inconclusive",
        "options": ["Promote", "Roll back", "Extend the stage"],
        "default": "Roll back",
        "timeout_s": 600.0,  # the demo profile's
        "assigned_users": [],
    }
    going = rollout_record()
    assert answers.question(going, 1, "advance", "") is None
    assert answers.question(going, 3, "promote", "") is None  # no confirm_promotion in the shipped plan
    with pytest.raises(ValueError, match="default"):
        Approval(default="promote")  # no promotion goes unseen


def test_the_approval_task_skips_without_a_question_and_otherwise_waits_with_the_evidence(monkeypatch):
    from airflow.providers.standard.operators import hitl
    from airflow.sdk.exceptions import AirflowSkipException, TaskAwaitingInput

    from mlrelease_airflow import approval

    task = approval.StageApproval(task_id="approve_2", stage=2, analysis_task="analyze_2")
    pushed: dict[str, dict] = {"analyze_2": {"status": "advance", "question": None}}
    ti = SimpleNamespace(id="ti-1", xcom_pull=lambda task_ids: pushed[task_ids])
    context = {"ti": ti, "task_instance": ti}
    with pytest.raises(AirflowSkipException, match="stage 2: advance: nothing to ask"):
        task.execute(context)

    written: dict = {}
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **detail: written.update(detail))
    report = SimpleNamespace(report_url="http://airflow/mlrelease/reports/r")
    monkeypatch.setattr("mlrelease_airflow.notify_alert.alert_from_context", lambda context, event: report)
    task.notifiers = []  # the alert channels are tested with the notifiers
    result = {
        "model_version": 7,
        "status": "paused: a human decides",
        "samples": {"long_tail": {"candidate": 812, "stable": 15_300}},
        "results": [
            {
                "cohort": "long_tail",
                "metric": "error_rate",
                "verdict": "inconclusive",
                "threshold": 0.001,
                "contract": "error_rate +0.1 pp vs stable",
                "band": {"estimate": 0.0004, "lower": -0.0011, "upper": 0.0019},
            }
        ],
        "outages": [],
        "question": {
            "question": "pause",
            "stage": 2,
            "reason": "stage long_tail: still inconclusive after 7200 s",
            "options": ["Promote", "Roll back", "Extend the stage"],
            "default": "Roll back",
            "timeout_s": 14400.0,
            "assigned_users": ["oncall-ml"],
        },
    }
    pushed["analyze_2"] = result
    with pytest.raises(TaskAwaitingInput) as parked:
        task.execute(context)
    assert parked.value.timeout == timedelta(hours=4)
    assert written["defaults"] == ["Roll back"] and written["options"] == ["Promote", "Roll back", "Extend the stage"]
    assert written["assigned_users"] == [{"id": "oncall-ml", "name": "oncall-ml"}]
    assert written["subject"] == "v7, stage 2 paused: promote, roll back or extend?"
    body = written["body"]
    assert "still inconclusive after 7200 s" in body and "| long_tail | error_rate +0.1 pp vs stable |" in body
    assert "0.0004 [-0.0011, 0.0019] | 0.001 |" in body and "long_tail: 812 vs 15,300" in body
    assert "http://airflow/mlrelease/reports/r" in body and "Unanswered after 4 h: **Roll back**" in body

    event = {
        "chosen_options": ["Extend the stage"],
        "params_input": {},
        "responded_at": datetime(2026, 11, 29, 5, tzinfo=UTC),
        "responded_by_user": {"id": "oncall-ml", "name": "oncall-ml"},
    }
    answer = task.execute_complete(context, event)
    assert answer == {
        "stage": 2,
        "question": "pause",
        "choice": "extend",
        "option": "Extend the stage",
        "at": "2026-11-29T05:00:00+00:00",
        "by": "oncall-ml",
    }
    assert answers.Answer.from_json(json.dumps(answer)).describe() == "extend the stage, answered by oncall-ml"
    timed_out = task.execute_complete(context, {**event, "chosen_options": ["Roll back"], "responded_by_user": None})
    assert timed_out["by"] is None and timed_out["choice"] == "rollback"
    with pytest.raises(ValueError, match="not in"):
        task.execute_complete(context, {**event, "chosen_options": ["Ship it"]})


class ThinSource(SlowSource):
    """Too few calls in either arm for any contract to decide."""

    def windows(self, since, until, exclude=()):
        rng = np.random.default_rng(1)
        return {(c, v): arm_window(30, rng=rng) for c in ("high_value", "long_tail", "core") for v in (1, 2)}


def test_a_stage_that_pauses_asks_the_approval_task_and_a_retry_asks_the_same(paused):
    paused.source = ThinSource()
    opened = paused.store.read()
    paused.store.update(lambda _: opened.model_copy(update={"phase": Phase.STAGE, "reason": ""}))
    with pytest.raises(Skipped, match="paused: stage high_value: still inconclusive"):
        steps.analyze(None, 1, 2, KEY)  # without --ask (the CLI, or an older DAG) a pause ends the step skipped
    paused.store.update(lambda _: opened.model_copy(update={"phase": Phase.STAGE, "reason": ""}))
    asked = steps.analyze(None, 1, 2, KEY, ask=True)
    assert asked["decided"] and asked["action"] == "pause" and paused.store.read().phase is Phase.PAUSED
    assert asked["question"]["question"] == "pause" and "still inconclusive" in asked["question"]["reason"]
    assert {r["verdict"] for r in asked["results"]} == {"inconclusive"}  # the evidence the approval task shows
    again = steps.analyze(None, 1, 2, KEY, ask=True)
    assert again["question"] == asked["question"] and again["status"] == "paused"


def test_where_approvals_are_off_a_question_leaves_the_rollout_paused_and_alerts(monkeypatch):
    from airflow.sdk.exceptions import AirflowSkipException

    from mlrelease_airflow import approval

    task = approval.StageApproval(task_id="approve_1", stage=1, analysis_task="analyze_1")
    asked = answers.question(rollout_record(Phase.PAUSED).model_copy(update={"reason": "inconclusive"}), 1, "pause", "")
    ti = SimpleNamespace(id="ti-1", xcom_pull=lambda task_ids: {"model_version": 2, "question": asked})
    alerted: list[str] = []
    monkeypatch.setattr(
        approval, "release_alerts", lambda event: [lambda context: alerted.append(f"{event} {context['ti'].id}")]
    )
    monkeypatch.setenv("MLRELEASE_APPROVALS", "off")  # `make run`: `airflow dags test` never times a question out
    with pytest.raises(AirflowSkipException, match=r"asks a human \(inconclusive\), but approvals are off here"):
        task.execute({"ti": ti, "task_instance": ti})
    assert alerted == ["task_skipped ti-1"]  # the pause alerts, as it did before approvals
    monkeypatch.setenv("MLRELEASE_APPROVALS", "maybe")
    with pytest.raises(ValueError, match="MLRELEASE_APPROVALS must be one of ask, off; got 'maybe'"):
        task.execute({"ti": ti, "task_instance": ti})
