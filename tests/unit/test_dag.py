"""The DAG files import cleanly, cheaply, and wire the steps as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlrelease.release_spec import nightly_dag_id
from mlrelease.summary import TASK_ORDER
from tests.conftest import REPO

NIGHTLY = nightly_dag_id("parcel_eta")

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
    assert set(bag.dag_ids) == {"nightly_release_parcel_eta", "nightly_release_late_delivery", "rollback_release"}


def test_nightly_release_wiring_schedule_and_params():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags[NIGHTLY]
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

    dag = DagBag(dag_folder=str(REPO / "dags")).dags[NIGHTLY]
    assert dag.get_task("shadow").upstream_task_ids == {"benchmark"}
    assert dag.get_task("rollout_stage_1").upstream_task_ids == {"shadow"}
    chain = ["shadow"]
    for n in (1, 2, 3):
        stage = [f"rollout_stage_{n}", f"wait_{n}", f"analyze_{n}", f"approve_{n}", f"answer_{n}"]
        for upstream, downstream in zip(stage, stage[1:], strict=False):
            assert dag.get_task(downstream).upstream_task_ids == {upstream}, downstream
        # The next stage (or the promotion) opens after the analysis, and after the answer when a human was asked:
        # none_failed_min_one_success, as the answer is skipped whenever nothing was asked.
        after = dag.get_task(f"rollout_stage_{n + 1}" if n < 3 else "promote")
        assert after.upstream_task_ids == {f"analyze_{n}", f"answer_{n}"}, after.task_id
        assert after.trigger_rule == "none_failed_min_one_success"
        chain += stage
        wait = dag.get_task(f"wait_{n}")
        assert type(wait).__name__ == "DateTimeSensorAsync"  # no worker held while a stage runs
        assert f"rollout_stage_{n}" in wait.target_time and "analyze_at" in wait.target_time
        assert dag.get_task(f"rollout_stage_{n}").arguments[-4:] == ["--stage", str(n), "--wired-stages", "3"]
        assert "--ask" in dag.get_task(f"analyze_{n}").arguments  # a pause is a question for approve_N
        approve = dag.get_task(f"approve_{n}")
        assert type(approve).__name__ == "StageApproval" and approve.analysis_task == f"analyze_{n}"
        assert approve.options == ["Promote", "Roll back", "Extend the stage"]
        assert_alerts(approve.notifiers, "approval_needed")
        answer = dag.get_task(f"answer_{n}")
        assert answer.arguments[-4:] == [
            "--stage",
            str(n),
            "--answer",
            f"{{{{ ti.xcom_pull(task_ids='approve_{n}') | tojson }}}}",
        ]
        assert_alerts(answer.on_skipped_callback, "task_skipped")  # an extended stage that paused again alerts
    assert dag.get_task("rollout_stage_1").trigger_rule == "all_success"
    chain += ["promote", "wait_retire", "retire"]
    assert dag.get_task("wait_retire").upstream_task_ids == {"promote"}
    assert dag.get_task("retire").upstream_task_ids == {"wait_retire"}
    rollback = dag.get_task("rollback")
    # Every rollout task up to the promotion; not the keep-window wait and retire after it.
    assert rollback.trigger_rule == "one_failed" and set(chain[:-2]) == rollback.upstream_task_ids
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


def test_one_nightly_dag_per_declared_model_with_its_own_form_and_model():
    """Each spec gets its DAG: the form's defaults are its spec's, and every step process releases its model."""
    from airflow.dag_processing.dagbag import DagBag

    from mlrelease.release_spec import spec_named

    bag = DagBag(dag_folder=str(REPO / "dags"))
    for model in ("parcel_eta", "late_delivery"):
        spec, dag = spec_named(model), bag.dags[nightly_dag_id(model)]
        assert f"model:{model}" in dag.tags and f"`{model}`" in dag.doc_md and spec.rollout_plan in dag.doc_md
        params = dag.params
        assert params["rollout_plan"] == spec.rollout_plan
        assert (params["max_p99_ratio"], params["min_throughput_ratio"]) == (
            spec.perf.max_p99_ratio,
            spec.perf.min_throughput_ratio,
        )
        steps = [t for t in dag.tasks if hasattr(t, "env_vars")]
        assert len(steps) > 10 and {t.env_vars["MLRELEASE_MODEL"] for t in steps} == {model}
        assert dag.timetable.expression == spec.schedule
    assert bag.dags[nightly_dag_id("late_delivery")].params["rollout_plan"] == "models/late_delivery/rollout_plan.yaml"
    # The rollback form offers every declared model, and its step releases the one picked.
    control = bag.dags["rollback_release"]
    assert control.params.get_param("model").schema["enum"] == ["late_delivery", "parcel_eta"]
    assert control.tasks[0].env_vars["MLRELEASE_MODEL"] == "{{ params.model }}"


NEW_SPEC = """
import re, shutil, sys
from pathlib import Path

repo, specs = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(repo / "models" / "late_delivery", specs / "late_delivery")
# A user's new model: a copy of an example under another name, on another schedule, with a two-stage plan.
spec = (specs / "late_delivery" / "release.yaml").read_text()
(specs / "route_risk").mkdir()
plan = (specs / "late_delivery" / "rollout_plan.yaml").read_text()
spec = spec.replace("name: late_delivery", "name: route_risk").replace(
    "rollout_plan: models/late_delivery/rollout_plan.yaml", f"rollout_plan: {specs}/route_risk/plan.yaml"
)
(specs / "route_risk" / "release.yaml").write_text(spec + 'schedule: "30 3 * * *"\\n')
(specs / "route_risk" / "plan.yaml").write_text(re.sub(r"  - name: bulky\\n(    .*\\n)+", "", plan))
# And a broken one: its DAG is missing, the others are not.
(specs / "broken").mkdir()
(specs / "broken" / "release.yaml").write_text("name: broken\\ntask: ranking\\n")
"""


def test_a_new_spec_folder_gets_its_dag_and_a_broken_one_blocks_no_other(tmp_path):
    """Adding a model is adding a folder; a spec that does not load loses its own DAG only, with its error logged."""
    specs = tmp_path / "models"
    subprocess.run([sys.executable, "-c", NEW_SPEC, str(REPO), str(specs)], check=True)
    code = (
        "import json, logging, sys; sys.path.insert(0, sys.argv[1] + '/plugins');"
        "from airflow.dag_processing.dagbag import DagBag;"
        "bag = DagBag(dag_folder=sys.argv[1] + '/dags');"
        "dags = {i: [d.timetable.expression if hasattr(d.timetable, 'expression') else None,"
        " sorted(t.task_id for t in d.tasks), sorted(d.params.get_param('model').schema.get('enum', []))"
        " if 'model' in d.params else None] for i, d in bag.dags.items()};"
        "print(json.dumps({'dags': dags, 'errors': list(bag.import_errors)}))"
    )
    env = {**os.environ, "MLRELEASE_SPECS_DIR": str(specs)}
    env.pop("MLRELEASE_MODEL", None)  # the DAG processor releases no one model
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, env=env, check=True)
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed["errors"] == []
    dags = parsed["dags"]
    assert set(dags) == {"nightly_release_late_delivery", "nightly_release_route_risk", "rollback_release"}
    assert dags["nightly_release_route_risk"][0] == "30 3 * * *"
    # Its plan's two stages are wired (the example's three less the third stage's tasks).
    third = {"rollout_stage_3", "wait_3", "analyze_3", "approve_3", "answer_3"}
    assert set(dags["nightly_release_late_delivery"][1]) - set(dags["nightly_release_route_risk"][1]) == third
    assert dags["rollback_release"][2] == ["broken", "late_delivery", "route_risk"]
    logged = out.stdout + out.stderr
    assert "no nightly DAG for model folder broken" in logged and "task: Input should be 'regression'" in logged
