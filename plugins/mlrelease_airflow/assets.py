"""The Airflow Assets the release updates, so that other DAGs can be scheduled on them.

- One asset per online feature view: `materialize` loads the run's window of every view into the online store
  (`feast://<project>/<view>`, group `feature`).
- One champion per declared model: its nightly DAG's `promote` moves the MLflow alias `champion`
  (`models:/<model>@champion`, group `model`; the URI is MLflow's own model URI, so a consumer can load exactly
  what it names).

A consumer DAG builds the asset it needs rather than spelling the name and URI again (an asset is identified
by both)::

    from mlrelease_airflow.assets import champion_model

    with DAG("score_backlog", schedule=[champion_model("parcel_eta")], ...):
        ...

Pure definitions: nothing here reads Feast or MLflow; `tests/unit/test_assets.py` checks the view names against
`feature_repo/` and each nightly DAG's outlet against its model.
"""

from __future__ import annotations

from airflow.sdk import Asset

NAMESPACE = "mlrelease"  # prefix of every asset name
FEAST_PROJECT = "mlrelease"  # feature_repo/feature_store.yaml `project`
# The online feature views of feature_repo/features.py, which `materialize` loads (all of them, every run).
FEATURE_VIEWS = ("user_features", "package_features", "route_features")
CHAMPION_ALIAS = "champion"


def feature_view_asset(view: str) -> Asset:
    """The asset of one online feature view, updated when `materialize` has loaded a run's window into it."""
    return Asset(
        name=f"{NAMESPACE}.features.{view}",
        uri=f"feast://{FEAST_PROJECT}/{view}",
        group="feature",
        extra={"feast_project": FEAST_PROJECT, "feature_view": view},
    )


FEATURE_ASSETS: tuple[Asset, ...] = tuple(feature_view_asset(view) for view in FEATURE_VIEWS)
"""Outlets of `materialize`."""


def champion_model(model: str) -> Asset:
    """Outlet of model `model`'s `promote`: its champion alias moved to a new version."""
    return Asset(
        name=f"{NAMESPACE}.model.{model}.{CHAMPION_ALIAS}",
        uri=f"models:/{model}@{CHAMPION_ALIAS}",
        group="model",
        extra={"registry": "mlflow", "model": model, "alias": CHAMPION_ALIAS},
    )
