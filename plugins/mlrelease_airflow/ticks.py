"""Steps that decide over time (the stage analysis) run one tick per execution; the operator defers between ticks.

A tick step answers `decided: false` with `next_check_at` while its question is open. The operator then
defers on a DateTimeTrigger (no worker slot, no pod is held while the stage gathers traffic) and runs the
step again when it fires. Both runners share this, so the DAG behaves the same locally and on Kubernetes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

# The shortest deferral between two looks. The LocalExecutor reports SUCCESS when the worker that deferred exits, and
# handling that event drops the task's key from the executor's running set; if the scheduler handles it only after
# the trigger fired and the resumed task (same key: same try number) already runs, the key is gone, and the scheduler
# fails the running task as "killed externally" (its report then gets "invalid state: failed"). With looks 3 s apart
# a busy scheduler lost that race in the live-Airflow test in 3 of 3 runs this session. Stages last minutes and the
# gateway's fast guard acts within a second, so a look at most 15 s later costs no safety.
MIN_DEFERRAL = timedelta(seconds=15)


def next_check(result: Any) -> datetime | None:
    """When to look again, for an undecided tick result; None when the step decided (or is no tick step)."""
    if not isinstance(result, dict) or result.get("decided") is not False:
        return None
    return datetime.fromisoformat(str(result["next_check_at"]))


def defer_until_next_check(
    operator: Any, result: Any, method_name: str = "execute_again", *, now: datetime | None = None
) -> None:
    """Defer `operator` until the tick's next check (at least MIN_DEFERRAL away) when `result` is undecided."""
    moment = next_check(result)
    if moment is None:
        return
    moment = max(moment, (now or datetime.now(UTC)) + MIN_DEFERRAL)
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    operator.log.info("not decided yet (%s); next look at %s", result.get("reason", ""), moment.isoformat())
    operator.defer(trigger=DateTimeTrigger(moment=moment), method_name=method_name)
