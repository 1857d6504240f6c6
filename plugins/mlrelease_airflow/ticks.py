"""Steps that decide over time (the stage analysis) run one tick per execution; the operator defers between ticks.

A tick step answers `decided: false` with `next_check_at` while its question is open. The operator then
defers on a DateTimeTrigger (no worker slot, no pod is held while the stage gathers traffic) and runs the
step again when it fires. Both runners share this, so the DAG behaves the same locally and on Kubernetes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


def next_check(result: Any) -> datetime | None:
    """When to look again, for an undecided tick result; None when the step decided (or is no tick step)."""
    if not isinstance(result, dict) or result.get("decided") is not False:
        return None
    return datetime.fromisoformat(str(result["next_check_at"]))


def defer_until_next_check(operator: Any, result: Any, method_name: str = "execute_again") -> None:
    """Defer `operator` until the tick's next check when `result` is undecided; return otherwise."""
    moment = next_check(result)
    if moment is None:
        return
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    operator.log.info("not decided yet (%s); next look at %s", result.get("reason", ""), moment.isoformat())
    operator.defer(trigger=DateTimeTrigger(moment=moment), method_name=method_name)
