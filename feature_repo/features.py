"""Feast definitions of the parcel network: entities, sources, feature views, and a feature service per model.

Sources are the date-partitioned parquet tables under $MLRELEASE_HOME/data/offline (FileSource, or SparkSource
when the Feast YAML's offline store is Spark: MLRELEASE_DATA_ENGINE=spark). Each feature
view carries its freshness budget as a tag (`freshness_budget_hours`); `mlrelease step
check-freshness` reads it from the registry, so the budget lives next to the feature it guards. A model's
release spec (models/<name>/release.yaml, `features.service`) names the service it trains on and is served with.
"""

import os
from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
from feast.types import Bool, Float64, Int64, String

_HOME = Path(os.environ.get("MLRELEASE_HOME", Path(__file__).resolve().parents[1] / ".mlrelease"))
_OFFLINE = _HOME / "data" / "offline"

user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64, description="A shipper account.")
package = Entity(name="package", join_keys=["package_id"], value_type=ValueType.INT64, description="One parcel.")
route = Entity(name="route", join_keys=["route_id"], value_type=ValueType.INT64, description="A lane of the network.")


def _source(table: str) -> FileSource | SparkSource:
    """One definition of each table for both offline stores: the same parquet folder, read by pandas or by Spark."""
    options = {"name": f"{table}_source", "path": str(_OFFLINE / table), "timestamp_field": "event_timestamp"}
    if os.environ.get("MLRELEASE_DATA_ENGINE") == "spark":  # set from the Feast YAML (mlrelease.feast_store)
        return SparkSource(file_format="parquet", **options)
    return FileSource(**options)


user_features = FeatureView(
    name="user_features",
    entities=[user],
    ttl=timedelta(days=2),
    schema=[
        Field(name="tier", dtype=String),
        Field(name="account_age_days", dtype=Int64),
        Field(name="orders_30d", dtype=Int64),
        Field(name="avg_declared_value_30d", dtype=Float64),
    ],
    source=_source("users"),
    online=True,
    tags={"freshness_budget_hours": "36", "owner": "growth-data"},
)

package_features = FeatureView(
    name="package_features",
    entities=[package],
    ttl=timedelta(days=7),
    schema=[
        Field(name="weight_kg", dtype=Float64),
        Field(name="volume_l", dtype=Float64),
        Field(name="declared_value", dtype=Float64),
        Field(name="category", dtype=String),
        Field(name="is_bulky", dtype=Bool),
    ],
    source=_source("packages"),
    online=True,
    tags={"freshness_budget_hours": "6", "owner": "fulfilment-data"},
)

route_features = FeatureView(
    name="route_features",
    entities=[route],
    ttl=timedelta(days=1),
    schema=[
        Field(name="region", dtype=String),
        Field(name="distance_km", dtype=Float64),
        Field(name="is_remote", dtype=Bool),
        Field(name="congestion_index", dtype=Float64),
        Field(name="avg_transit_hours_7d", dtype=Float64),
    ],
    source=_source("routes"),
    online=True,
    tags={"freshness_budget_hours": "9", "owner": "network-data"},
)

parcel_eta_v1 = FeatureService(
    name="parcel_eta_v1",
    features=[user_features, package_features, route_features],
    description="Everything the parcel ETA model reads at training and serving time.",
)

late_delivery_v1 = FeatureService(
    name="late_delivery_v1",
    features=[
        user_features[["tier"]],
        package_features[["weight_kg", "volume_l", "category", "is_bulky"]],
        route_features,
    ],
    description="What the late-delivery classifier reads: the shipper's tier, the parcel's size and its route.",
)
