"""The replay and traffic pool: orders with their model features and cohort, never with an outcome."""

from __future__ import annotations

from datetime import UTC, datetime

from mlrelease.data.schema import ORDERS
from mlrelease.gateway.traffic import order_pool
from mlrelease.release_spec import load_specs

LABELS = {"eta_hours", "promised_hours", "is_late"}  # what an order turned out to be: known only afterwards


def test_the_pool_holds_every_models_inputs_and_no_label(clean_offline):
    assert LABELS <= set(ORDERS.column_names)
    specs = load_specs()
    assert {spec.features.label.column for spec in specs.values()} <= LABELS
    for spec in specs.values():
        pool = order_pool(clean_offline, datetime(2026, 11, 29, 2, tzinfo=UTC), spec.cohorts, hours=5)
        assert not LABELS & set(pool.columns), sorted(pool.columns)
        assert {"order_id", *spec.features.entity_keys, *spec.features.columns} <= set(pool.columns)
        assert set(pool["cohort"]) <= set(spec.cohorts.names) and pool["order_id"].is_unique
