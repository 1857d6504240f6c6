"""The model's input contract: which Feast features, in which order, encoded how (shared by training and serving)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mlrelease.data.schema import PACKAGE_CATEGORIES, REGIONS, USER_TIERS

FEATURE_SERVICE = "parcel_eta_v1"
TARGET = "eta_hours"
ENTITY_KEYS = ("user_id", "package_id", "route_id")

# Categorical features become their index in a fixed vocabulary; an unknown value becomes -1
# (tree models route it like any other value, and the gateway encodes the same way).
VOCABULARIES: dict[str, tuple[str, ...]] = {
    "tier": USER_TIERS,
    "category": PACKAGE_CATEGORIES,
    "region": REGIONS,
}

# Model input columns, in ONNX input order. Changing this list changes the model's input schema.
FEATURES: tuple[str, ...] = (
    "tier",
    "account_age_days",
    "orders_30d",
    "avg_declared_value_30d",
    "weight_kg",
    "volume_l",
    "declared_value",
    "category",
    "is_bulky",
    "region",
    "distance_km",
    "is_remote",
    "congestion_index",
    "avg_transit_hours_7d",
)


def encode(frame: pd.DataFrame) -> np.ndarray:
    """The float32 matrix [rows, len(FEATURES)] the model takes; a missing column is a ValueError naming it."""
    missing = [c for c in FEATURES if c not in frame.columns]
    if missing:
        raise ValueError(f"feature frame lacks columns {missing}")
    columns = []
    for name in FEATURES:
        values = frame[name]
        if name in VOCABULARIES:
            lookup = {v: float(i) for i, v in enumerate(VOCABULARIES[name])}
            columns.append(values.map(lookup).fillna(-1.0).to_numpy(dtype="float32"))
        else:
            columns.append(pd.to_numeric(values, errors="coerce").astype("float64").to_numpy(dtype="float32"))
    return np.column_stack(columns).astype("float32")
