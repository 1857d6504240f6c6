"""Assets: materialize updates one per feature view, promote the champion model; other DAGs can be scheduled on them."""

from __future__ import annotations

import ast
import textwrap

import pytest
import yaml

from mlrelease.release_spec import nightly_dag_id
from mlrelease_airflow.assets import FEAST_PROJECT, FEATURE_ASSETS, FEATURE_VIEWS, champion_model
from tests.conftest import REPO

CHAMPION_MODEL = champion_model("parcel_eta")


@pytest.fixture(scope="module")
def nightly():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags[nightly_dag_id("parcel_eta")]


def test_materialize_and_promote_carry_the_assets_and_nothing_else_does(nightly):
    outlets = {task.task_id: list(task.outlets) for task in nightly.tasks if task.outlets}
    assert outlets == {"materialize": list(FEATURE_ASSETS), "promote": [CHAMPION_MODEL]}
    assert [a.uri for a in FEATURE_ASSETS] == [f"feast://mlrelease/{view}" for view in FEATURE_VIEWS]
    assert {a.group for a in FEATURE_ASSETS} == {"feature"}
    # MLflow's own URI for the alias: what a consumer loads (mlflow.pyfunc.load_model(CHAMPION_MODEL.uri)).
    assert (CHAMPION_MODEL.uri, CHAMPION_MODEL.group) == ("models:/parcel_eta@champion", "model")


def test_each_models_dag_promotes_its_own_champion_asset():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    for model in ("parcel_eta", "late_delivery"):
        promote = bag.dags[nightly_dag_id(model)].get_task("promote")
        assert [a.uri for a in promote.outlets] == [f"models:/{model}@champion"]
        assert promote.outlets[0].extra == {"registry": "mlflow", "model": model, "alias": "champion"}


def test_the_assets_name_what_the_feature_repo_defines():
    """Kept by hand in the plugin (no Feast at DAG parse): checked against its one definition."""
    store = yaml.safe_load((REPO / "feature_repo" / "feature_store.yaml").read_text(encoding="utf-8"))
    assert store["project"] == FEAST_PROJECT
    tree = ast.parse((REPO / "feature_repo" / "features.py").read_text(encoding="utf-8"))
    online = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FeatureView":
            kwargs = {k.arg: k.value for k in node.keywords}
            if not isinstance(kwargs.get("online"), ast.Constant) or kwargs["online"].value is not False:
                online.append(ast.literal_eval(kwargs["name"]))
    assert sorted(online) == sorted(FEATURE_VIEWS)


def test_the_dag_with_its_outlets_serializes_as_the_dag_processor_stores_it(nightly):
    from airflow.serialization.serialized_objects import DagSerialization

    serialized = DagSerialization.to_dict(nightly)
    DagSerialization.validate_schema(serialized)
    tasks = {t["__var"]["task_id"]: t["__var"] for t in serialized["dag"]["tasks"]}
    assert [o["__var"]["uri"] for o in tasks["promote"]["outlets"]] == ["models:/parcel_eta@champion"]
    assert len(tasks["materialize"]["outlets"]) == len(FEATURE_VIEWS)


CONSUMER = '''
"""A downstream team's DAG: rescore the backlog whenever a new champion is promoted."""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from mlrelease_airflow.assets import FEATURE_ASSETS, champion_model

CHAMPION_MODEL = champion_model("parcel_eta")

with DAG(dag_id="score_backlog", schedule=[CHAMPION_MODEL], start_date=datetime(2026, 1, 1), catchup=False):
    EmptyOperator(task_id="score")

# Or on fresh route features and a champion together.
route = next(a for a in FEATURE_ASSETS if a.uri.endswith("/route_features"))
with DAG(dag_id="route_report", schedule=route & CHAMPION_MODEL, start_date=datetime(2026, 1, 1), catchup=False):
    EmptyOperator(task_id="report")
'''


def test_a_consumer_dag_scheduled_on_the_model_asset_parses(tmp_path):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    (tmp_path / "consumer.py").write_text(textwrap.dedent(CONSUMER), encoding="utf-8")
    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    score, report = bag.dags["score_backlog"], bag.dags["route_report"]
    assert type(score.timetable).__name__ == "AssetTriggeredTimetable"
    assert _uris(score.timetable.asset_condition) == ["models:/parcel_eta@champion"]
    assert _uris(report.timetable.asset_condition) == [
        "feast://mlrelease/route_features",
        "models:/parcel_eta@champion",
    ]
    for dag in (score, report):
        DagSerialization.validate_schema(DagSerialization.to_dict(dag))


def _uris(condition) -> list[str]:
    """The URIs of every asset in a schedule's condition (nested all/any), sorted."""
    if hasattr(condition, "objects"):
        return sorted(uri for part in condition.objects for uri in _uris(part))
    return [condition.uri]


def test_kubernetes_tasks_carry_the_same_outlets_and_serialize(monkeypatch):
    """With the cluster runner (deferrable pod operators) the outlets are the same and the DAG still serializes."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    monkeypatch.setenv("MLRELEASE_RUNNER", "kubernetes")
    monkeypatch.setenv("MLRELEASE_K8S_POD_TEMPLATE_FILE", str(REPO / "deploy" / "airflow" / "step-pod-template.yaml"))
    dag = DagBag(dag_folder=str(REPO / "dags")).dags[nightly_dag_id("parcel_eta")]
    promote, materialize = dag.get_task("promote"), dag.get_task("materialize")
    assert type(promote).__name__ == "StepPodOperator" and promote.deferrable
    assert promote.outlets == [CHAMPION_MODEL] and materialize.outlets == list(FEATURE_ASSETS)
    serialized = DagSerialization.to_dict(dag)
    DagSerialization.validate_schema(serialized)
    tasks = {t["__var"]["task_id"]: t["__var"] for t in serialized["dag"]["tasks"]}
    assert tasks["promote"]["pod_template_file"].endswith("step-pod-template.yaml")
