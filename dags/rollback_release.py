"""Manual release control from the Airflow UI: roll back to a version, abort a rollout, or promote a paused one."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from mlrelease.release_spec import spec_paths
from mlrelease.stepdefs import RELEASE_CONTROL_DAG_ID, release_control_params
from mlrelease_airflow.catalog import dag_params
from mlrelease_airflow.factory import step_operator
from mlrelease_airflow.notifiers import release_alerts

DOC = """
### Rollback / release control

Trigger this DAG from the UI with the form below; one task runs `mlrelease step manual-release` for the
model picked in the form (any declared model: `models/<name>/release.yaml`).

- `rollback_to_version`: `target_version` is loaded, serves **all** traffic and becomes `champion`
  (a running rollout is rolled back first).
- `abort_rollout`: the running or paused rollout is rolled back: traffic to stable in one write, the
  candidate unloaded, aliases restored.
- `promote_paused`: a paused rollout's candidate is promoted by hand (e.g. after a cohort was rolled back).

Traffic always moves first; the MLflow alias is the commit point. Every action is recorded on the model
versions (tags) and in the rollout history (`mlrelease rollout status`).
"""

# The models the form offers: every declared spec folder, by name only (nothing is validated at parse: one that does
# not load is still offered, and its step fails naming the spec's error, rather than the model missing from the form).
MODELS = tuple(path.parent.name for path in spec_paths())

with DAG(
    dag_id=RELEASE_CONTROL_DAG_ID,
    description="Manual rollback to a version, abort of the running rollout, or promotion of a paused one",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    tags=["mlrelease", "release", "manual"],
    default_args={"owner": "ml-platform", "retries": 0, "on_failure_callback": release_alerts("task_failed")},
    params=dag_params(release_control_params(MODELS)),  # the form: declared with manual-release's arguments
) as dag:
    step_operator("manual-release", model="{{ params.model }}")  # the step process releases the form's model
