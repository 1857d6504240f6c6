"""The approval task after each rollout stage: an Airflow human-in-the-loop task that asks only when the stage asked.

`analyze_N --ask` ends with the stage's question in its result when the stage paused (or passed, under a plan that
wants promotions confirmed). `approve_N` then shows the evidence (every contract's band against its tolerance, the
outage if any, the release report link) on the run's Required Actions page and waits in Airflow's `awaiting_input`
state (no worker, no pod) for promote / roll back / extend; after the plan's timeout its default is taken. With no
question it skips itself at once, and so does the `answer_N` step after it. The answer goes to `answer_N` as XCom.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk.exceptions import AirflowSkipException

from mlrelease.rollout.answer import OPTIONS
from mlrelease_airflow.notifiers import release_alerts

# Where no person can answer (`make run`'s `airflow dags test`, which never times a question out), approvals are off:
# a stage that asks leaves the rollout paused, as a pause did before approvals, alerts, and rollback_release decides.
APPROVALS_ENV = "MLRELEASE_APPROVALS"
APPROVALS = ("ask", "off")

WHAT = {
    "Promote": "past this stage: the next stage opens, or, after the last, the candidate becomes champion",
    "Roll back": "every cohort back to stable; the candidate is unloaded and the run ends failed, as any rollback",
    "Extend the stage": "the stage stays open for another maximum exposure (looking longer spends no more error "
    "budget: every band is anytime-valid), then it decides again",
}


class StageApproval(HITLOperator):
    """Ask a human about stage `stage` when `analyze_N` asked; skip at once otherwise.

    :param stage: the stage (from 1) whose analysis task (`analysis_task`) may ask.
    """

    ui_color = "#fff3cd"

    def __init__(self, *, stage: int, analysis_task: str, **kwargs: Any) -> None:
        super().__init__(
            subject=f"Rollout stage {stage}",
            options=list(OPTIONS),
            notifiers=release_alerts("approval_needed"),
            **kwargs,
        )
        self.stage = stage
        self.analysis_task = analysis_task

    def execute(self, context: Any) -> Any:
        """Skip when the stage asked nothing; otherwise write the question with its evidence and wait for an answer."""
        result = context["ti"].xcom_pull(task_ids=self.analysis_task) or {}
        asked = result.get("question")
        if not asked:
            raise AirflowSkipException(f"stage {self.stage}: {result.get('status', 'decided')}: nothing to ask")
        if approvals() == "off":
            for alert in release_alerts("task_skipped"):
                alert(context)
            raise AirflowSkipException(
                f"stage {self.stage} asks a human ({asked['reason']}), but approvals are off here "
                f"({APPROVALS_ENV}=off): the rollout stays paused; decide with the rollback_release DAG"
            )
        from mlrelease_airflow.notify_alert import alert_from_context

        self.subject = subject(result)
        self.body = question_body(result, alert_from_context(context, "approval_needed").report_url)
        self.defaults = [asked["default"]]
        self.response_timeout = timedelta(seconds=float(asked["timeout_s"]))
        self.assigned_users = [{"id": user, "name": user} for user in asked["assigned_users"]] or None
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """The answer as `answer_N` reads it: stage, question, choice, when, and who (None: the timeout's default)."""
        payload = super().execute_complete(context, event)
        asked = (context["ti"].xcom_pull(task_ids=self.analysis_task) or {}).get("question") or {}
        user = payload.get("responded_by_user") or {}
        option = payload["chosen_options"][0]
        return {
            "stage": self.stage,
            "question": asked.get("question", "pause"),
            "choice": OPTIONS[option],
            "option": option,
            "at": payload["responded_at"].isoformat(),
            "by": user.get("name") or user.get("id") or None,
        }


def approvals() -> str:
    """`ask` (default) or `off`, from MLRELEASE_APPROVALS; anything else is an error naming the choices."""
    mode = os.environ.get(APPROVALS_ENV, "ask")
    if mode not in APPROVALS:
        raise ValueError(f"{APPROVALS_ENV} must be one of {', '.join(APPROVALS)}; got {mode!r}")
    return mode


def subject(result: dict[str, Any]) -> str:
    """The question's headline, e.g. `v7, stage 2 (long_tail) paused: promote, roll back or extend?`."""
    asked = result["question"]
    what = "passed: confirm the promotion" if asked["question"] == "confirm_promotion" else "paused"
    return f"v{result.get('model_version')}, stage {asked['stage']} {what}: promote, roll back or extend?"


def question_body(result: dict[str, Any], report_url: str | None) -> str:
    """The evidence, in Markdown: the reason, every contract's band against its tolerance, outages, the options."""
    asked = result["question"]
    lines = [f"**Why it asks**: {asked['reason'] or asked['question']}", ""]
    rows = result.get("results") or []
    if rows:
        lines += ["| cohort | contract | verdict | estimate [band] | tolerance |", "|---|---|---|---|---|"]
        lines += [_row(row) for row in rows]
        lines.append("")
    for outage in result.get("outages") or []:
        still = " (still going on)" if outage.get("ongoing") else ""
        lines.append(
            f"**Outage**: {outage.get('kind')} from {outage.get('start')} for {outage.get('duration_s')} s{still}: "
            f"{outage.get('detail')}"
        )
    samples = result.get("samples") or {}
    if samples:
        counts = "; ".join(f"{c}: {n.get('candidate', 0):,} vs {n.get('stable', 0):,}" for c, n in samples.items())
        lines.append(f"**Requests** (candidate vs stable): {counts}")
    if report_url:
        lines.append(f"**Release report**: [{report_url}]({report_url})")
    lines += ["", *[f"- **{option}**: {WHAT[option]}" for option in OPTIONS]]
    lines.append(f"\nUnanswered after {_duration(float(asked['timeout_s']))}: **{asked['default']}**.")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """`45 s`, `10 min` or `4 h`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.3g} h"


def _row(row: dict[str, Any]) -> str:
    band = row.get("band") or {}
    shown = (
        f"{band['estimate']:.4g} [{band['lower']:.4g}, {band['upper']:.4g}]"
        if all(isinstance(band.get(k), int | float) for k in ("estimate", "lower", "upper"))
        else "—"
    )
    threshold = row.get("threshold")
    tolerance = f"{threshold:.4g}" if isinstance(threshold, int | float) else "—"
    contract = row.get("contract") or row.get("metric")
    return f"| {row.get('cohort')} | {contract} | {row.get('verdict')} | {shown} | {tolerance} |"
