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
]


def test_dagbag_has_no_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert "nightly_release" in bag.dag_ids


def test_nightly_release_wiring_schedule_and_params():
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["nightly_release"]
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.timetable.expression == "0 2 * * *" and str(dag.timetable.timezone) == "UTC"
    order = [
        "apply_features",
        "materialize",
        "check_freshness",
        "validate_data",
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
        assert task.on_failure_callback, f"{task.task_id} has no failure alert"
    assert "reference_days" in dag.doc_md


def test_dag_file_keeps_heavy_libraries_out_of_module_level():
    code = (
        "import runpy, sys, json; sys.path.insert(0, sys.argv[1] + '/plugins');"
        "runpy.run_path(sys.argv[1] + '/dags/nightly_release.py');"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, check=True, env=os.environ.copy()
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
