from datetime import date

import numpy as np
import pandas as pd
import pytest

from mlrelease.data.generate import INJECT_MODES, STALE_HOURS, generate, partition_path
from mlrelease.data.schema import TABLES

DAY = date(2026, 11, 28)


def _read(root, table, day=DAY):
    return pd.read_parquet(partition_path(root, table, day))


def test_same_seed_same_bytes_and_ranges_compose(tmp_path):
    generate(tmp_path / "a", date(2026, 11, 27), DAY, rows_per_day=300, seed=3)
    generate(tmp_path / "b", DAY, DAY, rows_per_day=300, seed=3)
    generate(tmp_path / "c", DAY, DAY, rows_per_day=300, seed=4)
    for table in TABLES:
        a, b = _read(tmp_path / "a", table), _read(tmp_path / "b", table)
        pd.testing.assert_frame_equal(a, b)
    assert not _read(tmp_path / "a", "orders").equals(_read(tmp_path / "c", "orders"))


def test_tables_match_schema_and_keys(tmp_path):
    totals = generate(tmp_path, DAY, DAY, rows_per_day=500, seed=1)
    assert totals["orders"] == 500 and totals["packages"] == 500
    for name, table in TABLES.items():
        frame = _read(tmp_path, name)
        assert list(frame.columns) == table.column_names
        assert str(frame["event_timestamp"].dt.tz) == "UTC"
        assert frame["event_timestamp"].dt.date.eq(DAY).all()
    orders = _read(tmp_path, "orders")
    assert orders["order_id"].is_unique
    assert set(orders["route_id"]) <= set(_read(tmp_path, "routes")["route_id"])


def test_distributions_are_realistic(tmp_path):
    generate(tmp_path, DAY, DAY, rows_per_day=4000, seed=2)
    users, routes = _read(tmp_path, "users"), _read(tmp_path, "routes")
    orders, packages = _read(tmp_path, "orders"), _read(tmp_path, "packages")
    tier_share = users["tier"].value_counts(normalize=True)
    assert 0.6 < tier_share["standard"] < 0.8 and 0.03 < tier_share["premium"] < 0.15
    remote_share = routes.drop_duplicates("route_id")["is_remote"].mean()
    assert 0.08 < remote_share < 0.3
    # The target depends on the features: remote routes and bulky parcels take longer.
    joined = orders.merge(routes.drop_duplicates("route_id")[["route_id", "is_remote", "distance_km"]], on="route_id")
    joined = joined.merge(packages[["package_id", "is_bulky"]], on="package_id")
    assert joined.loc[joined.is_remote, "eta_hours"].mean() > joined.loc[~joined.is_remote, "eta_hours"].mean() + 10
    assert joined.loc[joined.is_bulky, "eta_hours"].mean() > joined.loc[~joined.is_bulky, "eta_hours"].mean()
    assert np.corrcoef(joined["distance_km"], joined["eta_hours"])[0, 1] > 0.5


@pytest.mark.parametrize("mode", INJECT_MODES)
def test_each_injection_produces_its_corruption(tmp_path, mode):
    generate(tmp_path / "clean", DAY, DAY, rows_per_day=500, seed=5)
    generate(tmp_path / "bad", DAY, DAY, rows_per_day=500, seed=5, inject=mode)
    clean = {t: _read(tmp_path / "clean", t) for t in TABLES}
    bad = {t: _read(tmp_path / "bad", t) for t in TABLES}
    if mode == "nulls":
        assert bad["routes"]["distance_km"].isna().mean() > 0.1 and clean["routes"]["distance_km"].notna().all()
        assert bad["users"]["tier"].isna().any()
    elif mode == "drift":
        assert bad["routes"]["distance_km"].median() > 2 * clean["routes"]["distance_km"].median()
    elif mode == "schema":
        assert "distance_km" not in bad["routes"] and "distance_miles" in bad["routes"]
        assert pd.api.types.is_string_dtype(bad["packages"]["weight_kg"])
    elif mode == "stale":
        # Every route update of the last STALE_HOURS of the range (here: all of its one day) is gone.
        assert bad["routes"].empty and not clean["routes"].empty
        assert len(bad["orders"]) == len(clean["orders"])
    elif mode == "duplicates":
        assert not bad["orders"]["order_id"].is_unique and clean["orders"]["order_id"].is_unique


def test_stale_routes_stop_a_day_and_a_half_before_the_end(tmp_path):
    generate(tmp_path, date(2026, 11, 26), DAY, rows_per_day=200, seed=5, inject="stale")
    routes = pd.read_parquet(tmp_path / "routes")
    cutoff = pd.Timestamp("2026-11-29", tz="UTC") - pd.Timedelta(hours=STALE_HOURS)
    assert routes["event_timestamp"].max() < cutoff
    assert routes["event_timestamp"].max() > cutoff - pd.Timedelta(hours=7)  # updates ran until then


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="before --start"):
        generate(tmp_path, DAY, date(2026, 11, 1))
    with pytest.raises(ValueError, match="unknown --inject 'chaos'"):
        generate(tmp_path, DAY, DAY, inject="chaos")
    with pytest.raises(ValueError, match="--rows-per-day"):
        generate(tmp_path, DAY, DAY, rows_per_day=0)
