"""The local runner executes the pod's command as a real process and honours the XCom contract."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from mlrelease_airflow.catalog import STEPS as CATALOGUE
from mlrelease_airflow.local_runner import LocalStepOperator
from mlrelease_airflow.render_pods import sample_context

pytestmark = pytest.mark.integration
END = datetime(2026, 11, 29, 2, tzinfo=UTC)
RUN_STEPS = "artifacts/parcel_eta/20261129T020000Z/steps"  # where a task records its outcome
STEPS = {name: dataclasses.replace(pod, model="parcel_eta") for name, pod in CATALOGUE.items()}  # the DAG's model


def run_task(op: LocalStepOperator, run_id: str = "manual__1") -> object:
    """Render the operator's templates for a run ending at END (as Airflow does before execute), then run it."""
    context = {**sample_context(op.task_id), "data_interval_end": END, "run_id": run_id}
    op.render_template_fields(context)
    return op.execute(context)


def test_success_returns_the_steps_json_and_records_it(home_with_data):
    op = LocalStepOperator(task_id="apply_features", pod=STEPS["apply-features"])
    result = run_task(op)
    assert result["feature_views"] == ["package_features", "route_features", "user_features"]
    recorded = json.loads((home_with_data / RUN_STEPS / "apply_features.json").read_text())
    assert recorded == {  # recorded by the step itself, as in a pod
        "task_id": "apply_features",
        "step": "apply-features",
        "run_id": "manual__1",
        "try_number": 1,
        "exit_code": 0,
        "recorded_by": "step",
        "status": "success",
        "result": result,
    }


def test_failure_raises_the_steps_one_line_error(home_with_data):
    pod = dataclasses.replace(STEPS["check-freshness"], args=("--end", "not-a-time"))
    op = LocalStepOperator(task_id="check_freshness", pod=pod)
    op.arguments = list(pod.args)
    with pytest.raises(AirflowException, match=r"^mlrelease step check-freshness: error: bad --end 'not-a-time'"):
        run_task(op)
    recorded = json.loads((home_with_data / RUN_STEPS / "check_freshness.json").read_text())
    assert recorded["status"] == "failed" and "bad --end" in recorded["error"]


def test_a_gate_verdict_fails_without_retry(home_with_data):
    run_task(LocalStepOperator(task_id="apply_features", pod=STEPS["apply-features"]))
    op = LocalStepOperator(task_id="check_freshness", pod=STEPS["check-freshness"])
    op.arguments = ["--end", "2026-11-29T02:00:00+00:00"]
    # Nothing was materialized: a verdict (exit 3), which retrying cannot change.
    with pytest.raises(AirflowFailException, match="stale features .* never materialized"):
        run_task(op)


def test_nothing_to_do_ends_the_task_skipped(home_with_data):
    from airflow.sdk.exceptions import AirflowSkipException

    op = LocalStepOperator(task_id="shadow", pod=STEPS["shadow"])
    # No champion in an empty registry: a first release has nothing to compare with (exit 4).
    op.arguments = ["--model-version", "1", "--end", "2026-11-29T02:00:00+00:00", "--plan", ""]
    with pytest.raises(AirflowSkipException, match="shadow: skipped: v1 is the champion already"):
        run_task(op)
    recorded = json.loads((home_with_data / RUN_STEPS / "shadow.json").read_text())
    assert recorded["status"] == "skipped" and "nothing to shadow" in recorded["reason"]
