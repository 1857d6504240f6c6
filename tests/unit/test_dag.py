"""The DAG files import cleanly, cheaply, and wire the steps as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlrelease.summary import TASK_ORDER
from tests.conftest import REPO

HEAVY = [
    "feast",
    "mlflow",
    "great_expectations",
    "tritonclient",
    "sklearn",
    "onnxruntime",
    "pandas",
    "pyarrow",
    "airflow.providers.cncf.kubernetes.operators.pod",
    "slack_sdk",
    "airflow.providers.slack.hooks.slack_webhook",  # the package itself is loaded by provider discovery
]
ALERT_CHANNELS = {"WebhookAlertNotifier", "SlackAlertNotifier", "EmailAlertNotifier"}


def assert_alerts(callbacks, event):
    """Every channel (generic webhook, Slack, e-mail) is wired, each for `event`."""
    assert callbacks, f"no {event} alert"
    assert sorted(type(c).__name__ for c in callbacks) == sorted(ALERT_CHANNELS), callbacks
    assert {c.event for c in callbacks} == {event}


def test_dagbag_has_no_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert {"nightly_release", "rollback_release"} <= set(bag.dag_ids)


def test_nightly_release_wiring_schedule_and_params():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["nightly_release"]
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.timetable.expression == "0 2 * * *" and str(dag.timetable.timezone) == "UTC"
    order = [
        "apply_features",
        "validate_data",
        "materialize",
        "check_freshness",
        "train",
        "export",
        "validate_serving",
        "benchmark",
    ]
    assert order == list(TASK_ORDER)  # the summary reports in the DAG's order
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}
    params = dag.params
    assert params["reference_days"] == 7 and params["psi_threshold"] == 0.25
    assert params["max_p99_ratio"] == 1.10 and params["min_throughput_ratio"] == 0.90 and params["training_days"] == 7
    assert params.get_param("reference_days").schema["type"] == "integer"
    for task in dag.tasks:
        assert_alerts(task.on_failure_callback, "task_failed")
    assert "reference_days" in dag.doc_md


def test_dag_file_keeps_heavy_libraries_out_of_module_level():
    code = (
        "import runpy, sys, json; sys.path.insert(0, sys.argv[1] + '/plugins');"
        "runpy.run_path(sys.argv[1] + '/dags/nightly_release.py');"
        "runpy.run_path(sys.argv[1] + '/dags/rollback_release.py');"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_rollout_wiring_waits_are_deferrable_and_a_failure_rolls_back():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["nightly_release"]
    chain = ["benchmark", "shadow"]
    for n in (1, 2, 3):
        chain += [f"rollout_stage_{n}", f"wait_{n}", f"analyze_{n}"]
    chain += ["promote", "wait_retire", "retire"]
    for upstream, downstream in zip(chain, chain[1:], strict=False):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}, downstream
    for n in (1, 2, 3):
        wait = dag.get_task(f"wait_{n}")
        assert type(wait).__name__ == "DateTimeSensorAsync"  # no worker held while a stage runs
        assert f"rollout_stage_{n}" in wait.target_time and "analyze_at" in wait.target_time
        assert dag.get_task(f"rollout_stage_{n}").arguments[-4:] == ["--stage", str(n), "--wired-stages", "3"]
        assert_alerts(dag.get_task(f"analyze_{n}").on_skipped_callback, "task_skipped")  # a pause alerts too
    rollback = dag.get_task("rollback")
    # Every rollout task up to the promotion; not the keep-window wait and retire after it.
    assert rollback.trigger_rule == "one_failed" and set(chain[1:-2]) == rollback.upstream_task_ids
    assert chain[-2:] == ["wait_retire", "retire"]
    assert_alerts(rollback.on_success_callback, "rolled_back")  # the rollback confirms itself
    assert_alerts(dag.get_task("promote").on_success_callback, "promoted")  # and so does a promotion
    assert not dag.get_task("retire").on_success_callback
    verdict = dag.get_task("release_complete")
    assert verdict.upstream_task_ids == {"retire", "rollback"} and verdict.trigger_rule == "none_failed"
    # The report runs once the release is decided (promotion or rollback), as a teardown: Airflow leaves it out
    # of the run's state, so release_complete stays the verdict and a report problem never turns it.
    report = dag.get_task("report")
    assert report.is_teardown and not report.on_failure_fail_dagrun and not report.downstream_task_ids
    assert report.upstream_task_ids == {"promote", "rollback"}
    assert report.arguments == ["--end", "{{ data_interval_end.isoformat() }}"]
    leaves = {t.task_id for t in dag.tasks if not t.downstream_task_ids}
    assert leaves == {"release_complete", "report"}
    assert {t.task_id for t in dag.tasks if not t.downstream_task_ids and not t.is_teardown} == {"release_complete"}
    params = dag.params
    assert params["rollout_plan"] == "config/rollout_plan.yaml"
    assert params.get_param("rollout_profile").schema["enum"] == ["production", "demo"]


def test_rollback_release_dag_is_manual_with_a_typed_form():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["rollback_release"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # manual triggers only
    params = dag.params
    assert params.get_param("action").schema["enum"] == ["rollback_to_version", "abort_rollout", "promote_paused"]
    assert params.get_param("target_version").schema["type"] == ["null", "integer"]
    (task,) = dag.tasks
    assert task.arguments[:2] == ["--action", "{{ params.action }}"]
    assert_alerts(task.on_failure_callback, "task_failed")
