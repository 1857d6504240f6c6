"""What every alert says, whatever the channel: the event, the task and run, the release report link and,
for rollout events, the rollout's numbers (candidate, stable, stage, reason).

Built from an Airflow callback context. Every lookup beyond the context itself (the task's XCom result, the
rollout record) is best-effort: a failing lookup is logged and left out, it never stops the alert.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

EVENTS = ("task_failed", "rolled_back", "promoted", "task_skipped", "approval_needed")
EMOJI = {
    "task_failed": ":rotating_light:",
    "rolled_back": ":rewind:",
    "promoted": ":rocket:",
    "task_skipped": ":pause_button:",
    "approval_needed": ":raising_hand:",
}


class AlertDeliveryError(RuntimeError):
    """A configured alert channel could not deliver (receiver error, refused mail, bad configuration)."""


def check_event(event: str) -> str:
    """`event` itself when it is one of EVENTS; a ValueError naming the known events otherwise."""
    if event not in EVENTS:
        raise ValueError(f"unknown alert event {event!r}; known events: {', '.join(EVENTS)}")
    return event


def subscribed(events: str | None, event: str, *, source: str) -> bool:
    """Whether a channel's comma-separated `events` filter (None or empty: every event) includes `event`."""
    if not events or not events.strip():
        return True
    wanted = [e.strip() for e in events.split(",") if e.strip()]
    unknown = [e for e in wanted if e not in EVENTS]
    if unknown:
        raise AlertDeliveryError(f"{source}: unknown event(s) {', '.join(unknown)}; known events: {', '.join(EVENTS)}")
    return event in wanted


@dataclass(frozen=True)
class Alert:
    """One alert, channel-independent; `rollout` holds the numbers known for a rollout event (may be empty)."""

    event: str
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    try_number: int | None
    data_interval_end: str | None
    run_key: str | None
    error: str | None
    log_url: str | None
    report_url: str | None
    rollout: dict[str, Any] = field(default_factory=dict)

    @property
    def candidate(self) -> str:
        """`v7` when the candidate version is known, else a neutral word."""
        version = self.rollout.get("candidate_version")
        return f"v{version}" if version is not None else "the candidate"

    def headline(self) -> str:
        """One line saying what happened, e.g. `nightly_release rolled back v7`."""
        dag = self.dag_id or "mlrelease"
        if self.event == "rolled_back":
            return f"{dag} rolled back {self.candidate}"
        if self.event == "promoted":
            return f"{dag} promoted {self.candidate}"
        if self.event == "task_skipped":
            return f"{dag} paused the rollout of {self.candidate} for a human"
        if self.event == "approval_needed":
            return f"{dag} asks a human about {self.candidate}: promote, roll back or extend (Required Actions)"
        return f"{dag}.{self.task_id} failed"

    def subject(self) -> str:
        """The e-mail subject: `[mlrelease] <headline> (run <run_id>)`."""
        return f"[mlrelease] {self.headline()} (run {self.run_id})"

    def task_fields(self) -> list[tuple[str, str]]:
        """DAG, task, run and try, as label/value pairs for display."""
        return [
            ("DAG", str(self.dag_id)),
            ("Task", str(self.task_id)),
            ("Run", str(self.run_id)),
            ("Try", str(self.try_number)),
        ]

    def rollout_fields(self) -> list[tuple[str, str]]:
        """The rollout numbers known for this alert, as label/value pairs (empty when there are none)."""
        numbers = self.rollout
        fields: list[tuple[str, str]] = []
        if numbers.get("candidate_version") is not None:
            fields.append(("Candidate", f"v{numbers['candidate_version']}"))
        if numbers.get("stable_version") is not None:
            label = "Previous champion" if self.event == "promoted" else "Stable"
            fields.append((label, f"v{numbers['stable_version']}"))
        if numbers.get("stage") is not None:
            of = f" of {numbers['stages']}" if numbers.get("stages") else ""
            name = f" ({numbers['stage_name']})" if numbers.get("stage_name") else ""
            fields.append(("Stage", f"{numbers['stage']}{of}{name}"))
        if numbers.get("phase"):
            fields.append(("Phase", str(numbers["phase"])))
        if numbers.get("excluded_cohorts"):
            fields.append(("Cohorts rolled back", ", ".join(numbers["excluded_cohorts"])))
        if numbers.get("previous_unload_after"):
            fields.append(("Previous champion unloaded after", str(numbers["previous_unload_after"])))
        if numbers.get("reason"):
            fields.append(("Reason", str(numbers["reason"])))
        return fields


def alert_from_context(context: dict[str, Any], event: str) -> Alert:
    """The alert for callback `context` (task instance, dag_run, exception, data_interval_end)."""
    check_event(event)
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    exception = context.get("exception")
    end = context.get("data_interval_end")
    key = _run_key(end)
    model = alerting_model(context)
    return Alert(
        event=event,
        dag_id=getattr(ti, "dag_id", None),
        task_id=getattr(ti, "task_id", None),
        run_id=getattr(dag_run, "run_id", None) or getattr(ti, "run_id", None),
        try_number=getattr(ti, "try_number", None),
        data_interval_end=str(end) if end is not None else None,
        run_key=key,
        error=str(exception) if exception is not None else None,
        log_url=_best_effort("log URL", lambda: getattr(ti, "log_url", None)),
        report_url=_best_effort("report link", lambda: _report_url(key, model)),
        rollout=_best_effort("rollout numbers", lambda: rollout_numbers(ti, key, model)) or {},
    )


def _best_effort(what: str, lookup: Any) -> Any:
    """`lookup()`, or None (logged) when it raises: a lookup must never stop the alert."""
    try:
        return lookup()
    except Exception as exc:  # noqa: BLE001 - any failure here is reported in the log and left out
        log.warning("alert: could not look up the %s: %s", what, exc)
        return None


def _run_key(end: Any) -> str | None:
    """The run's artifact key from its data interval end (a datetime, or an ISO string in tests)."""
    from mlrelease.timewindow import parse_timestamp, run_key

    if end is None:
        return None
    if not isinstance(end, datetime):
        end = parse_timestamp(str(end), name="data_interval_end")
    return run_key(end)


def alerting_model(context: dict[str, Any]) -> str | None:
    """The model the alerting run releases: its form's `model` (rollback_release), else its nightly DAG's."""
    from mlrelease.release_spec import model_of_nightly_dag

    chosen = (context.get("params") or {}).get("model")
    if chosen:
        return str(chosen)
    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(ti, "dag_id", None)
    return model_of_nightly_dag(dag_id) if dag_id else None


def _report_url(key: str | None, model: str | None) -> str | None:
    """The release report link for model `model`'s run `key` (None without a data interval or a model)."""
    if key is None or model is None:
        return None
    from mlrelease.report.links import report_url
    from mlrelease.settings import Settings

    return report_url(Settings.from_env().for_model(model), key)


def rollout_numbers(ti: Any, key: str | None, model: str | None) -> dict[str, Any]:
    """Candidate, stable, stage and reason: the task's own XCom result first, then this run's rollout record."""
    numbers: dict[str, Any] = {}
    record = _best_effort("rollout record", lambda: _rollout_record(key, model))
    if record is not None:
        stages = record.plan.stages
        numbers.update(
            candidate_version=record.candidate_version,
            stable_version=record.stable_version,
            stage=record.stage,
            stages=len(stages) or None,
            stage_name=stages[record.stage - 1].name if 1 <= record.stage <= len(stages) else None,
            phase=str(record.phase),
            reason=record.reason or None,
            excluded_cohorts=list(record.excluded_cohorts),
        )
    result = _best_effort("task result (XCom)", lambda: _task_result(ti))
    if isinstance(result, dict):
        # What this task itself reported wins over the record (the record may have moved on since).
        for ours, theirs in (
            ("candidate_version", "model_version"),
            ("stable_version", "stable_version"),
            ("stable_version", "previous_version"),
            ("reason", "reason"),
            ("previous_unload_after", "previous_unload_after"),
        ):
            if result.get(theirs) is not None:
                numbers[ours] = result[theirs]
    return {k: v for k, v in numbers.items() if v not in (None, [], "")}


def _task_result(ti: Any) -> Any:
    """The task's return-value XCom (pushed before success callbacks run); None when it has none."""
    pull = getattr(ti, "xcom_pull", None)
    if pull is None:
        return None
    return pull(task_ids=ti.task_id)


def _rollout_record(key: str | None, model: str | None) -> Any:
    """Model `model`'s stored rollout record (a RolloutRecord), when it belongs to run `key`."""
    if key is None or model is None:
        return None
    from mlrelease.rollout.store import RolloutStore
    from mlrelease.settings import Settings

    record = RolloutStore.from_settings(Settings.from_env(), model).read()
    if record is None or record.run_key != key:
        return None  # another run's rollout: its numbers would mislead
    return record


def connection_or_none(conn_id: str) -> Any:
    """Airflow connection `conn_id` (from any secrets backend, e.g. `AIRFLOW_CONN_<ID>`), None when it does not exist.

    Looked up when an alert fires, never at DAG parse time (which must not touch connections).
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def events_filter(conn: Any) -> str | None:
    """The connection's `events` extra: the comma-separated events its channel receives (None: every event)."""
    value = conn.extra_dejson.get("events")
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return value


def subscribed_connection(conn_id: str, event: str, channel: str, log: Any) -> Any:
    """The channel's connection when it exists and subscribes to `event`; None (with a logged reason) otherwise."""
    conn = connection_or_none(conn_id)
    if conn is None:
        log.info("%s alert skipped: no connection %s", channel, conn_id)
        return None
    if not subscribed(events_filter(conn), event, source=f"connection {conn_id} extra events"):
        log.info("%s alert skipped: %s is not in the events of connection %s", channel, event, conn_id)
        return None
    return conn
