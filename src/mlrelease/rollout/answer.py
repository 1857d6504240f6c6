"""A human's answer to a question the rollout asks inside the nightly run, and what it does to the record (pure).

The rollout asks when a stage pauses (`pause`) and, when the plan says so, before promoting a rollout whose every
stage passed (`confirm_promotion`). The DAG's approval task (an Airflow human-in-the-loop task) shows the evidence
and records the answer; the `answer` step carries it out. The options are Argo Rollouts' verbs: *promote* moves past
the stage that asked (the next stage, or champion after the last), *roll back* sends every cohort back to stable,
*extend* keeps the stage open for another maximum exposure (every band is anytime-valid: looking longer spends no
more of the error budget).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from mlrelease.errors import StepError
from mlrelease.rollout.machine import Phase, replace
from mlrelease.rollout.plan import ApprovalChoice
from mlrelease.rollout.store import RolloutRecord

# The options the approval task offers (what a person reads) and the choice each one means.
OPTIONS: dict[str, ApprovalChoice] = {"Promote": "promote", "Roll back": "rollback", "Extend the stage": "extend"}
LABELS: dict[ApprovalChoice, str] = {choice: label for label, choice in OPTIONS.items()}
Question = Literal["pause", "confirm_promotion"]
QUESTIONS: tuple[Question, ...] = ("pause", "confirm_promotion")


@dataclass(frozen=True)
class Answer:
    """One answer: to which stage's question, the choice, who gave it (None: the default, taken at the timeout)."""

    stage: int
    question: Question
    choice: ApprovalChoice
    at: datetime
    by: str | None = None

    @classmethod
    def from_json(cls, text: str) -> Answer:
        """Parse the approval task's answer (its XCom, as JSON); a StepError names what is wrong with it."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise StepError(f"--answer is not JSON ({exc}): {text[:200]!r}") from None
        if not isinstance(raw, dict):
            raise StepError(f"--answer must be the approval task's answer object, got {text[:200]!r}")
        choice, question = raw.get("choice"), raw.get("question")
        if choice not in LABELS:
            raise StepError(f"--answer chose {choice!r}; the options are {', '.join(sorted(LABELS))}")
        if question not in QUESTIONS:
            raise StepError(f"--answer answers {question!r}; the questions are {', '.join(QUESTIONS)}")
        try:
            at = datetime.fromisoformat(str(raw["at"]))
            stage = int(raw["stage"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StepError(f"--answer needs its stage and an ISO 'at' time: {exc}") from None
        if at.tzinfo is None:
            raise StepError(f"--answer's time {raw['at']!r} has no UTC offset")
        by = raw.get("by")
        return cls(stage, cast(Question, question), cast(ApprovalChoice, choice), at, str(by) if by else None)

    def as_detail(self) -> dict[str, Any]:
        """The history event's detail (the record, `rollout status` and the report show it)."""
        return {
            "question": self.question,
            "choice": self.choice,
            "answered_at": self.at.isoformat(),
            "by": self.by,
            "timed_out": self.by is None,
        }

    def describe(self) -> str:
        """One phrase, e.g. `roll back, answered by alice` or `roll back (nobody answered: the default)`."""
        what = LABELS[self.choice].lower()
        return f"{what}, answered by {self.by}" if self.by else f"{what} (nobody answered in time: the default)"


def recorded(record: RolloutRecord, answer: Answer) -> bool:
    """Whether the record already holds this answer (a retried `answer` step records it once)."""
    return any(
        e.kind == "approval" and e.stage == answer.stage and e.detail.get("answered_at") == answer.at.isoformat()
        for e in record.history
    )


def check_question(record: RolloutRecord, answer: Answer) -> None:
    """Refuse an answer to a question the rollout is not asking (another stage, or a rollout that moved on)."""
    if record.stage != answer.stage:
        raise StepError(f"the answer is for stage {answer.stage}, but the rollout is at stage {record.stage}")
    if answer.question == "pause" and record.phase is not Phase.PAUSED:
        raise StepError(f"the answer is to a pause, but the rollout of v{record.candidate_version} is {record.phase}")
    if answer.question == "confirm_promotion" and (record.phase is not Phase.STAGE or not passed_last_stage(record)):
        raise StepError("the answer confirms a promotion, but the last stage has not passed its analysis")


def promotion_confirmed(record: RolloutRecord) -> bool:
    """Whether a human answered `promote` at the last stage (a paused rollout, or the plan's confirm_promotion)."""
    last = len(record.plan.stages)
    return any(e.kind == "approval" and e.stage == last and e.detail.get("choice") == "promote" for e in record.history)


def passed_last_stage(record: RolloutRecord) -> bool:
    """Whether the last stage's analysis decided to promote."""
    last = len(record.plan.stages)
    return any(e.kind == "analysis" and e.stage == last and e.detail.get("action") == "promote" for e in record.history)


def moved_past(record: RolloutRecord) -> RolloutRecord:
    """`promote` before the last stage: the paused stage counts as passed by a human, the next one opens next."""
    return replace(record, phase=Phase.STAGE, reason="", stage=record.stage + 1, stage_opened_at=None, extended_s=0.0)


def extended(record: RolloutRecord, now: datetime) -> RolloutRecord:
    """`extend`: the stage open again until one more maximum exposure from `now` (the pause may have waited long)."""
    stage = record.plan.stage(record.stage)
    maximum = stage.max_exposure_s[record.profile]
    assert record.stage_opened_at is not None
    elapsed = (now - record.stage_opened_at).total_seconds()
    return replace(record, phase=Phase.STAGE, reason="", extended_s=max(elapsed - maximum, 0.0) + maximum)


def question(record: RolloutRecord, stage: int, action: str, reason: str) -> dict[str, Any] | None:
    """What the approval task after stage `stage` asks, given the analysis' `action`; None when it asks nothing."""
    approval = record.plan.approval
    if record.phase is Phase.PAUSED and record.stage == stage:  # a pause, or a cohort held back at the last stage
        kind: Question = "pause"
        reason = record.reason or reason
    elif action == "promote" and approval.confirm_promotion and record.phase is Phase.STAGE:
        kind = "confirm_promotion"
    else:
        return None
    return {
        "question": kind,
        "stage": stage,
        "reason": reason,
        "options": list(OPTIONS),
        "default": LABELS[approval.default],
        "timeout_s": approval.timeout_s[record.profile],
        "assigned_users": list(approval.assigned_users),
    }
