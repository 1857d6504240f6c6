"""The local runner executes the pod's command as a real process and honours the XCom contract."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.local_runner import LocalStepOperator

pytestmark = pytest.mark.integration
END = datetime(2026, 11, 29, 2, tzinfo=UTC)


def test_success_returns_the_steps_json_and_records_it(home_with_data):
    op = LocalStepOperator(task_id="apply_features", pod=STEPS["apply-features"])
    result = op.execute({"data_interval_end": END, "run_id": "manual__1"})
    assert result["feature_views"] == ["package_features", "route_features", "user_features"]
    recorded = json.loads((home_with_data / "artifacts/20261129T020000Z/steps/apply_features.json").read_text())
    assert recorded == {
        "task_id": "apply_features",
        "step": "apply-features",
        "run_id": "manual__1",
        "status": "success",
        "result": result,
    }


def test_failure_raises_the_steps_one_line_error(home_with_data):
    pod = dataclasses.replace(STEPS["check-freshness"], args=("--end", "not-a-time"))
    op = LocalStepOperator(task_id="check_freshness", pod=pod)
    op.arguments = list(pod.args)
    with pytest.raises(AirflowException, match=r"^mlrelease step check-freshness: error: bad --end 'not-a-time'"):
        op.execute({"data_interval_end": END})
    recorded = json.loads((home_with_data / "artifacts/20261129T020000Z/steps/check_freshness.json").read_text())
    assert recorded["status"] == "failed" and "bad --end" in recorded["error"]


def test_a_gate_verdict_fails_without_retry(home_with_data):
    LocalStepOperator(task_id="apply_features", pod=STEPS["apply-features"]).execute({"data_interval_end": END})
    op = LocalStepOperator(task_id="check_freshness", pod=STEPS["check-freshness"])
    op.arguments = ["--end", "2026-11-29T02:00:00+00:00"]
    # Nothing was materialized: a verdict (exit 3), which retrying cannot change.
    with pytest.raises(AirflowFailException, match="stale features .* never materialized"):
        op.execute({"data_interval_end": END})


def test_nothing_to_do_ends_the_task_skipped(home_with_data):
    from airflow.sdk.exceptions import AirflowSkipException

    op = LocalStepOperator(task_id="shadow", pod=STEPS["shadow"])
    # No champion in an empty registry: a first release has nothing to compare with (exit 4).
    op.arguments = ["--model-version", "1", "--end", "2026-11-29T02:00:00+00:00", "--plan", ""]
    with pytest.raises(AirflowSkipException, match="shadow: skipped: v1 is the champion already"):
        op.execute({"data_interval_end": END, "run_id": "manual__1"})
    recorded = json.loads((home_with_data / "artifacts/20261129T020000Z/steps/shadow.json").read_text())
    assert recorded["status"] == "skipped" and "nothing to shadow" in recorded["reason"]
