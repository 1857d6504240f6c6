"""The run's final verdict, decided from the step outcomes and the rollout record (pure)."""

from __future__ import annotations

from typing import Any

from mlrelease.report.model import Verdict
from mlrelease.rollout.machine import Phase
from mlrelease.rollout.store import RolloutRecord
from mlrelease.summary import ROLLOUT_ORDER, TASK_ORDER


def _status(outcomes: dict[str, dict[str, Any]], task: str) -> str | None:
    return outcomes.get(task, {}).get("status")


def _result(outcomes: dict[str, dict[str, Any]], task: str) -> dict[str, Any]:
    return outcomes.get(task, {}).get("result") or {}


def _stopped(outcomes: dict[str, dict[str, Any]], task: str) -> Verdict:
    return Verdict("stopped", f"Stopped at {task}", str(outcomes[task].get("error", "")))


def decide(outcomes: dict[str, dict[str, Any]], record: RolloutRecord | None) -> Verdict:
    """promoted / rolled back (all or cohorts) / rolling back / stopped at a gate / bootstrap / paused / in progress
    / not run."""
    if not outcomes:
        return Verdict("not_run", "Not run", "no step of this run recorded an outcome")
    for task in TASK_ORDER:
        if _status(outcomes, task) == "failed":
            return _stopped(outcomes, task)
    return _rollout_verdict(outcomes, record) or _unfinished(outcomes)


def _rollout_verdict(outcomes: dict[str, dict[str, Any]], record: RolloutRecord | None) -> Verdict | None:
    """What happened after the benchmark, in precedence order; None while nothing decided yet."""
    if _status(outcomes, "promote") == "success":
        promoted = _result(outcomes, "promote")
        held = tuple(promoted.get("excluded_cohorts") or ())
        detail = f"v{promoted.get('model_version')} is champion (was v{promoted.get('previous_version')})"
        return Verdict("promoted", "Promoted" + (f" ({', '.join(held)} held back)" if held else ""), detail)
    if _status(outcomes, "shadow") == "failed":
        return _stopped(outcomes, "shadow")
    if record is not None and record.phase is Phase.ROLLING_BACK:  # decided, routing not confirmed (yet)
        detail = f"routing may still send traffic to v{record.candidate_version}: {record.reason}"
        return Verdict("rolling_back", "Rolling back (not confirmed)", detail)
    if _status(outcomes, "rollback") == "success" or (record is not None and record.phase is Phase.ROLLED_BACK):
        reason = (record.reason if record is not None else "") or _result(outcomes, "rollback").get("reason", "")
        return Verdict("rolled_back", "Rolled back (all cohorts)", str(reason))
    if record is not None and record.excluded_cohorts:
        cohorts = ", ".join(record.excluded_cohorts)
        then = "paused for a human" if record.phase is Phase.PAUSED else f"rollout {record.phase}"
        return Verdict("cohort_rolled_back", f"Rolled back (cohort {cohorts})", f"{then}: {record.reason}")
    if record is not None and record.phase is Phase.PAUSED:
        return Verdict("paused", "Paused for a human", record.reason)
    failed = next((task for task in ROLLOUT_ORDER if _status(outcomes, task) == "failed"), None)
    if failed is not None:
        return _stopped(outcomes, failed)
    if _status(outcomes, "shadow") == "skipped":
        bench = str(_result(outcomes, "benchmark").get("status", ""))
        version = _result(outcomes, "train").get("model_version")
        if bench.startswith("bootstrap"):
            return Verdict("bootstrap", "Bootstrap", f"v{version} became the first champion; no rollout")
        return Verdict("bootstrap", "No rollout", str(outcomes["shadow"].get("reason", "")))
    return None


def _unfinished(outcomes: dict[str, dict[str, Any]]) -> Verdict:
    missing = next((t for t in TASK_ORDER if t not in outcomes), None)
    where = missing or next((t for t in ROLLOUT_ORDER if t not in outcomes), "the rollout")
    return Verdict("in_progress", "In progress", f"{where} has not finished")
