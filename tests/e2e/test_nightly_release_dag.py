"""Whole-DAG runs with `airflow dags test`: red at the right step on each corruption.

The clean night (green end to end, the first model released) runs on a real scheduler, triggered the way
the UI's form does it, in test_airflow_live.py.
"""

from __future__ import annotations

import shutil

import pytest

from mlrelease.data.generate import generate
from mlrelease.summary import TASK_ORDER
from tests.conftest import HISTORY, ROWS_PER_DAY, run_nightly_dag

pytestmark = pytest.mark.e2e
ORDER = list(TASK_ORDER)


# Two corruptions of different kinds in one window, each in its own table: a value check of the GX suite
# (packages.weight_kg negated) and the file contract (users written with timezone-naive timestamps). One DAG run
# must stop at validate_data naming both, run nothing downstream, and alert once. validate_data is the data half's
# gate, ahead of materialize: every corruption class alone, with its message and the online store untouched, is
# asserted step by step in tests/integration/test_data_gates.py (a DAG run costs ~1 min, so they share one here).
CORRUPTIONS = {
    "packages": ("negative_values", "packages.weight_kg date=2026-11-28: expected values lie in"),
    "users": ("naive_timestamps", "users.event_timestamp date=2026-11-28: type timestamp[us] has no"),
}


def test_corruptions_fail_at_their_gate_and_alert_once(home, migrated_airflow_db, receiver):
    offline = home / "data/offline"
    generate(offline, *HISTORY, rows_per_day=ROWS_PER_DAY, seed=11)
    for table, (mode, _) in CORRUPTIONS.items():  # the run's last two days of this table only, corrupted
        corrupted = home / f"corrupted-{mode}"
        generate(corrupted, HISTORY[1].replace(day=28), HISTORY[1], rows_per_day=ROWS_PER_DAY, seed=11, inject=mode)
        shutil.copytree(corrupted / table, offline / table, dirs_exist_ok=True)
    proc, outcomes = run_nightly_dag(home, migrated_airflow_db, receiver.url)
    logs = proc.stdout + proc.stderr
    assert "state=failed" in logs, logs[-3000:]
    failed_task = "validate_data"
    assert outcomes[failed_task]["status"] == "failed"
    for _, message in CORRUPTIONS.values():
        assert message in outcomes[failed_task]["error"], outcomes[failed_task]["error"]
    downstream = ORDER[ORDER.index(failed_task) + 1 :]
    assert not any(task in outcomes for task in downstream), f"{downstream} must not run after {failed_task}"
    alerts = [b["body"] for b in receiver.bodies]
    assert len(alerts) == 1, alerts
    assert alerts[0]["task_id"] == failed_task and alerts[0]["dag_id"] == "nightly_release_parcel_eta"
    assert all(message in alerts[0]["error"] for _, message in CORRUPTIONS.values()), alerts[0]["error"]
