from datetime import date, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlrelease.cli import build_parser
from mlrelease.data.generate import INJECT_MODES, STALE_HOURS, generate, partition_path
from mlrelease.data.schema import TABLES

DAY = date(2026, 11, 28)
PREV = DAY - timedelta(days=1)
ORIGINAL_MODES = ("nulls", "drift", "schema", "stale", "duplicates")
NEW_MODES = (
    "late_events",
    "empty_partition",
    "stuck_column",
    "republished",
    "orphans",
    "naive_timestamps",
    "units",
    "negative_values",
    "republished_new_ids",
    "appended_twice",
    "packages_after_orders",
    "feed_outage",
)


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
    # The late-delivery label: the promise is whole half-days, late means slower than promised, and it is common
    # enough to learn (about a quarter) yet more common on remote routes, where the delivery time varies most.
    assert (joined["promised_hours"] % 12 == 0).all() and (joined["promised_hours"] >= 12).all()
    assert (joined["is_late"] == (joined["eta_hours"] > joined["promised_hours"])).all()
    assert 0.15 < joined["is_late"].mean() < 0.35
    assert joined.loc[joined.is_remote, "is_late"].mean() > joined.loc[~joined.is_remote, "is_late"].mean()


@pytest.mark.parametrize("mode", ORIGINAL_MODES)
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
    with pytest.raises(ValueError, match="unknown --inject 'chaos'.*late_events.*negative_values"):
        generate(tmp_path, DAY, DAY, inject="chaos")
    with pytest.raises(ValueError, match="--rows-per-day"):
        generate(tmp_path, DAY, DAY, rows_per_day=0)


def test_inject_modes_list_every_mode_and_match_the_cli():
    assert INJECT_MODES == ORIGINAL_MODES + NEW_MODES
    gen = build_parser().parse_args(["data", "generate", "--start", "2026-11-28", "--end", "2026-11-28"])
    assert gen.inject is None
    for mode in INJECT_MODES:
        args = ["data", "generate", "--start", "2026-11-28", "--end", "2026-11-28", "--inject", mode]
        assert build_parser().parse_args(args).inject == mode
    with pytest.raises(SystemExit):
        build_parser().parse_args(["data", "generate", "--start", "2026-11-28", "--end", "2026-11-28", "--inject", "x"])


@pytest.fixture(scope="module")
def clean_two_days(tmp_path_factory):
    """A clean two-day range [PREV, DAY] that each new mode is compared against."""
    root = tmp_path_factory.mktemp("clean")
    generate(root, PREV, DAY, rows_per_day=200, seed=5)
    return root


def _bad(tmp_path, mode):
    generate(tmp_path, PREV, DAY, rows_per_day=200, seed=5, inject=mode)
    return tmp_path


def test_new_modes_are_deterministic(tmp_path):
    for mode in NEW_MODES:
        a, b = _bad(tmp_path / f"a-{mode}", mode), _bad(tmp_path / f"b-{mode}", mode)
        for table in TABLES:
            for day in (PREV, DAY):
                assert partition_path(a, table, day).read_bytes() == partition_path(b, table, day).read_bytes()


def test_late_events_misfile_the_same_orders_and_packages(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "late_events")
    for day in (PREV, DAY):
        orders, packages = _read(bad, "orders", day), _read(bad, "packages", day)
        clean = _read(clean_two_days, "orders", day)
        late = orders["event_timestamp"].dt.date.ne(day)
        assert late.mean() == pytest.approx(0.15, abs=0.01)
        assert (orders.loc[late, "event_timestamp"] - clean.loc[late, "event_timestamp"]).eq(pd.Timedelta(days=3)).all()
        assert orders.loc[~late, "event_timestamp"].equals(clean.loc[~late, "event_timestamp"])
        pd.testing.assert_series_equal(
            packages.set_index("package_id")["event_timestamp"],
            orders.set_index("package_id")["event_timestamp"],
        )
    assert _read(bad, "routes").equals(_read(clean_two_days, "routes"))


def test_empty_partition_only_on_the_first_day(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "empty_partition")
    for table in ("orders", "packages"):
        first, clean_first = _read(bad, table, PREV), _read(clean_two_days, table, PREV)
        assert first.empty and not clean_first.empty
        assert first.dtypes.equals(clean_first.dtypes)
        assert pq.read_schema(partition_path(bad, table, PREV)).equals(
            pq.read_schema(partition_path(clean_two_days, table, PREV)), check_metadata=False
        )
        pd.testing.assert_frame_equal(_read(bad, table, DAY), _read(clean_two_days, table, DAY))
    assert len(_read(bad, "users", PREV)) == len(_read(clean_two_days, "users", PREV))


def test_stuck_column_is_one_constant(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "stuck_column")
    for day in (PREV, DAY):
        routes = _read(bad, "routes", day)
        assert routes["congestion_index"].unique().tolist() == [0.35]
        assert _read(clean_two_days, "routes", day)["congestion_index"].nunique() > 10
        clean = _read(clean_two_days, "routes", day)
        pd.testing.assert_frame_equal(routes.drop(columns="congestion_index"), clean.drop(columns="congestion_index"))


def test_republished_repeats_the_previous_days_rows(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "republished")
    for table, key in (("orders", "order_id"), ("packages", "package_id")):
        today, yesterday = _read(bad, table, DAY), _read(clean_two_days, table, PREV)
        assert today[key].tolist() == yesterday[key].tolist()
        assert not set(today[key]) & set(_read(clean_two_days, table, DAY)[key])
        assert today["event_timestamp"].dt.date.eq(DAY).all()
        assert (today["event_timestamp"] - yesterday["event_timestamp"]).eq(pd.Timedelta(days=1)).all()
        pd.testing.assert_frame_equal(today.drop(columns="event_timestamp"), yesterday.drop(columns="event_timestamp"))
    # The first day is re-published from the day before the range, which was never written.
    assert _read(bad, "orders", PREV)["order_id"].tolist() == [
        (PREV - timedelta(days=1)).toordinal() * 1_000_000 + n for n in range(1, 201)
    ]


def test_orphans_point_at_packages_that_exist_nowhere(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "orphans")
    all_packages = set(pd.read_parquet(bad / "packages")["package_id"])
    for day in (PREV, DAY):
        orders = _read(bad, "orders", day)
        orphan = ~orders["package_id"].isin(all_packages)
        assert orphan.mean() == pytest.approx(0.05, abs=0.005)
        assert orders.loc[~orphan, "package_id"].equals(orders.loc[~orphan, "order_id"])
        assert orders["package_id"].is_unique and str(orders["package_id"].dtype) == "int64"
        pd.testing.assert_frame_equal(_read(bad, "packages", day), _read(clean_two_days, "packages", day))


def test_naive_timestamps_have_no_time_zone(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "naive_timestamps")
    for table in TABLES:
        field = pq.read_schema(partition_path(bad, table, DAY)).field("event_timestamp")
        assert pa.types.is_timestamp(field.type) and field.type.tz is None
        assert pq.read_schema(partition_path(clean_two_days, table, DAY)).field("event_timestamp").type.tz == "UTC"
        bad_ts, clean_ts = _read(bad, table)["event_timestamp"], _read(clean_two_days, table)["event_timestamp"]
        assert bad_ts.dt.tz is None
        assert bad_ts.equals(clean_ts.dt.tz_localize(None))  # the UTC wall clock, zone dropped


def test_units_write_pounds(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "units")
    weight, clean = _read(bad, "packages")["weight_kg"], _read(clean_two_days, "packages")["weight_kg"]
    assert weight.mean() / clean.mean() == pytest.approx(2.20462, rel=0.01)
    assert weight.equals((clean * 2.20462).round(2))


def test_negative_values_negate_a_few_weights(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "negative_values")
    for day in (PREV, DAY):
        weight, clean = _read(bad, "packages", day)["weight_kg"], _read(clean_two_days, "packages", day)["weight_kg"]
        negative = weight < 0
        assert negative.mean() == pytest.approx(0.03, abs=0.005)
        assert weight[negative].equals(-clean[negative]) and weight[~negative].equals(clean[~negative])
        assert (clean > 0).all()


def _content(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """What the rows say without their ids or event time, in a stable order."""
    columns = TABLES[table].content_columns
    return frame[columns].sort_values(columns).reset_index(drop=True)


def test_republished_new_ids_repeat_yesterdays_content_under_todays_ids(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "republished_new_ids")
    orders, packages = _read(bad, "orders"), _read(bad, "packages")
    assert orders["order_id"].tolist() == [DAY.toordinal() * 1_000_000 + n for n in range(1, 201)]
    assert orders["package_id"].equals(orders["order_id"]) and packages["package_id"].equals(orders["order_id"])
    for table, frame in (("orders", orders), ("packages", packages)):
        yesterday = _read(clean_two_days, table, PREV)
        pd.testing.assert_frame_equal(_content(frame, table), _content(yesterday, table))
        assert (frame["event_timestamp"] - yesterday["event_timestamp"]).eq(pd.Timedelta(days=1)).all()
        assert not _content(frame, table).equals(_content(_read(clean_two_days, table), table))


def test_appended_twice_doubles_the_day_under_new_ids(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "appended_twice")
    for table, key in (("orders", "order_id"), ("packages", "package_id")):
        frame, clean = _read(bad, table), _read(clean_two_days, table)
        assert len(frame) == 2 * len(clean) and frame[key].is_unique
        assert set(clean[key]) < set(frame[key]) and frame[key].max() < (DAY.toordinal() + 1) * 1_000_000
        pd.testing.assert_frame_equal(_content(frame, table), _content(pd.concat([clean, clean]), table))
        assert frame["event_timestamp"].is_monotonic_increasing


def test_packages_after_orders_are_created_later_the_same_day(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "packages_after_orders")
    for day in (PREV, DAY):
        orders, packages = _read(bad, "orders", day), _read(bad, "packages", day)
        pd.testing.assert_frame_equal(orders, _read(clean_two_days, "orders", day))
        delay = (packages["event_timestamp"] - orders["event_timestamp"]).dt.total_seconds() / 3600
        late = delay > 0
        assert late.mean() == pytest.approx(0.10, abs=0.03) and (delay >= 0).all()
        assert delay[late].between(1, 3).all()
        assert packages["event_timestamp"].dt.date.eq(day).all()  # still inside the partition's day


def test_feed_outage_loses_one_hour_of_orders_and_packages(tmp_path, clean_two_days):
    bad = _bad(tmp_path, "feed_outage")
    for table in ("orders", "packages"):
        frame, clean = _read(bad, table), _read(clean_two_days, table)
        assert not frame["event_timestamp"].dt.hour.eq(13).any() and clean["event_timestamp"].dt.hour.eq(13).any()
        kept = clean[clean["event_timestamp"].dt.hour != 13].reset_index(drop=True)
        pd.testing.assert_frame_equal(frame, kept)
    pd.testing.assert_frame_equal(_read(bad, "users"), _read(clean_two_days, "users"))
