import re
from datetime import date

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from mlrelease.data.schema import ORDERS, PACKAGES, ROUTES
from mlrelease.errors import StepError
from mlrelease.quality.contract import contract_problems
from mlrelease.quality.derived import (
    History,
    content_hashes,
    first_seen,
    key_hashes,
    row_hashes,
    with_derived_columns,
)
from mlrelease.quality.drift import edge_ranks, edges_from_order_statistics, psi, quantile_edges
from mlrelease.quality.findings import entries, failure_line
from mlrelease.quality.hourly import ALPHA, BINS, ROWS, gaps_from_counts, hour_gaps
from mlrelease.quality.ledger import PartitionFile, PartitionLedger
from mlrelease.quality.parameters import suite_parameters
from mlrelease.storage import sha256


def test_psi_is_near_zero_for_the_same_distribution_and_large_for_a_shift():
    rng = np.random.default_rng(0)
    ref = rng.normal(100, 20, 5000)
    assert psi(ref, rng.normal(100, 20, 5000)) < 0.02
    assert psi(ref, rng.normal(130, 20, 5000)) > 0.5
    moderate = psi(ref, rng.normal(108, 20, 5000))
    assert 0.05 < moderate < 0.5


def test_psi_ignores_nan_and_rejects_empty():
    ref = np.array([1.0, 2.0, 3.0, 4.0] * 50)
    assert psi(ref, np.append(ref, [np.nan] * 10)) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        psi(np.array([np.nan]), ref)


@pytest.mark.parametrize("seed", range(40))
def test_edges_from_order_statistics_are_numpys_quantile_edges_bit_for_bit(seed):
    # What the Spark engine computes from a few fetched order statistics must be np.quantile's edges exactly:
    # decimal data with long ties, sizes from 1 up. (Spark's own percentile, (1 - w)·a + w·b, is 1 ulp off on
    # 40 one-decimal values: edge 4 is 0.4600000000000002 there, 0.46000000000000013 in numpy.)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    sample = np.round(rng.lognormal(1.0, 0.8, n), int(rng.integers(0, 3)))
    ordered = np.sort(sample)
    ranks = edge_ranks(n)
    assert ranks == sorted(set(ranks)) and 0 <= ranks[0] and ranks[-1] < n
    edges = edges_from_order_statistics(n, {r: float(ordered[r]) for r in ranks})
    assert np.array_equal(edges, quantile_edges(sample))


def test_psi_of_a_constant_reference():
    assert psi(np.ones(100), np.ones(50)) == 0.0
    assert psi(np.ones(100), np.full(50, 2.0)) == float("inf")


SUITE = {
    "expectations": [
        {
            "type": "expect_table_row_count_to_be_between",
            "kwargs": {"min_value": {"$PARAMETER": "rows_min"}, "max_value": {"$PARAMETER": "rows_max"}},
            "meta": {"history": {"statistic": "median_rows", "low": 0.5, "high": 2.0}},
        },
        {
            "type": "expect_column_stdev_to_be_between",
            "kwargs": {"column": "x", "min_value": {"$PARAMETER": "x_stdev_min"}},
            "meta": {"history": {"statistic": "stdev", "low": 0.25, "min_rows": 10}},
        },
        {
            "type": "expect_column_mean_to_be_between",
            "kwargs": {
                "column": "x",
                "min_value": {"$PARAMETER": "x_mean_min"},
                "max_value": {"$PARAMETER": "x_mean_max"},
            },
            "meta": {"history": {"statistic": "mean", "low": 0.5, "high": 1.5, "z": 4.0}},
        },
        {
            "type": "expect_column_unique_value_count_to_be_between",
            "kwargs": {"column": "c", "min_value": {"$PARAMETER": "c_distinct_min"}},
            "meta": {"history": {"statistic": "distinct", "low": 0.6, "min_rows": 10}},
        },
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "x"}, "meta": {}},
    ]
}


def test_suite_parameters_follow_the_rules_the_suite_declares():
    ref = pd.DataFrame({"x": [10.0, 12.0, 8.0, 10.0] * 25, "c": list("abc") * 33 + ["a"]})
    batch = pd.DataFrame({"x": [10.0] * 100, "c": ["a"] * 100})
    params = suite_parameters(SUITE, batch, ref, [100, 90, 110])
    assert params["rows_min"] == 50 and params["rows_max"] == 200  # the median day, halved and doubled
    assert params["x_stdev_min"] == pytest.approx(0.25 * ref["x"].std())
    noise = 4.0 * ref["x"].std() / 10  # z standard errors of a 100-row batch's mean
    assert params["x_mean_min"] == pytest.approx(5.0 - noise) and params["x_mean_max"] == pytest.approx(15.0 + noise)
    assert params["c_distinct_min"] == 2  # ceil(0.6 * 3): one value left of three fails


def test_small_batches_and_missing_history_loosen_only_what_they_must():
    ref = pd.DataFrame({"x": [1.0, 2.0, 3.0], "c": list("abc")})
    small = suite_parameters(SUITE, pd.DataFrame({"x": [1.0] * 5, "c": ["a"] * 5}), ref, [5, 5])
    assert small["x_stdev_min"] == 0 and small["c_distinct_min"] == 0  # below min_rows: not judged
    none = suite_parameters(SUITE, pd.DataFrame({"x": [1.0], "c": ["a"]}), pd.DataFrame(), [])
    assert none["rows_min"] == 1 and none["rows_max"] is None  # no history: only an empty partition fails
    assert none["x_mean_min"] is None and none["x_mean_max"] is None


def test_contract_names_missing_unexpected_retyped_and_naive_time_columns():
    good = pa.schema(
        [("route_id", pa.int64()), ("event_timestamp", pa.timestamp("us", tz="UTC"))]
        + [
            (c.name, {"string": pa.string(), "float64": pa.float64(), "bool": pa.bool_()}[c.dtype])
            for c in ROUTES.columns[2:]
        ]
    )
    assert contract_problems(ROUTES, good) == []
    naive = good.set(1, pa.field("event_timestamp", pa.timestamp("ns")))
    assert contract_problems(ROUTES, naive) == [
        ("event_timestamp", "type timestamp[ns] has no time zone; event times must be UTC-aware")
    ]
    renamed = good.set(good.get_field_index("distance_km"), pa.field("distance_miles", pa.float64()))
    assert sorted(contract_problems(ROUTES, renamed)) == [
        ("distance_km", "missing column distance_km"),
        ("distance_miles", "unexpected column distance_miles (double)"),
    ]
    retyped = good.set(good.get_field_index("region"), pa.field("region", pa.int32()))
    assert contract_problems(ROUTES, retyped) == [("region", "type int32, expected string")]


def _orders(ids, packages, ts="2026-11-28T10:00:00Z", eta=None):
    times = pd.to_datetime(ts if isinstance(ts, list) else [ts] * len(ids), utc=True)
    return pd.DataFrame(
        {
            "order_id": ids,
            "event_timestamp": times,
            "user_id": [1] * len(ids),
            "package_id": packages,
            "route_id": [1] * len(ids),
            "eta_hours": eta or [10.0 + i for i in range(len(ids))],
            "promised_hours": [24.0] * len(ids),
            "is_late": [False] * len(ids),
        }
    )


def _history(earlier: pd.DataFrame, packages_since: pd.Series | None = None) -> History:
    return History(
        keys=[key_hashes(ORDERS, earlier)],
        rows=[row_hashes(ORDERS, earlier)],
        contents=[content_hashes(ORDERS, earlier)],
        known_keys={"users": np.array([1]), "packages": np.array([1, 2, 3, 4]), "routes": np.array([1])},
        since={"packages": packages_since if packages_since is not None else first_seen(PACKAGES, [])},
    )


def test_derived_columns_find_misfiled_republished_and_orphaned_rows():
    yesterday = _orders([1, 2], [1, 2], ts="2026-11-27T10:00:00Z")
    today = pd.concat([_orders([2, 3], [2, 99]), _orders([4], [4], ts="2026-12-01T00:00:00Z")], ignore_index=True)
    today["eta_hours"] = [20.0, 21.0, 22.0]
    out = with_derived_columns(ORDERS, today, date(2026, 11, 28), _history(yesterday))
    assert out["_in_partition_day"].tolist() == [True, True, False]  # the third is dated three days later
    assert out["_key_is_new"].tolist() == [False, True, True]  # order 2 was published yesterday
    assert out["_row_is_new"].tolist() == [True, True, True]  # its values differ (another eta)
    assert out["_content_is_new"].tolist() == [True, True, True]
    assert out["_package_id_exists"].tolist() == [True, False, True]
    copy = yesterday.assign(event_timestamp=yesterday["event_timestamp"] + pd.Timedelta(days=1))
    again = with_derived_columns(ORDERS, copy, date(2026, 11, 28), _history(yesterday))
    assert not again["_row_is_new"].any()  # a re-published day: same values, only the event time moved


def test_content_duplicates_under_new_keys_are_found_within_the_batch_and_against_earlier_days():
    yesterday = _orders([1, 2], [1, 2], ts="2026-11-27T10:00:00Z", eta=[10.0, 11.0])
    # Yesterday's first order again under new order and package ids; then today's own order appended twice.
    today = _orders([5, 6, 7], [5, 6, 7], eta=[10.0, 30.0, 30.0])
    out = with_derived_columns(ORDERS, today, date(2026, 11, 28), _history(yesterday))
    assert out["_key_is_new"].all() and out["_row_is_new"].all()  # nothing matches by key or with the key
    assert out["_content_is_new"].tolist() == [False, True, False]  # the first copy of 30.0 is the original
    assert "_content_is_new" not in with_derived_columns(ROUTES, _routes(), date(2026, 11, 28), History())


def _routes() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "route_id": [1, 2],
            "event_timestamp": pd.to_datetime(["2026-11-28T06:00:00Z"] * 2, utc=True),
            "region": ["north", "north"],
            "distance_km": [10.0, 10.0],  # two routes may well say the same: snapshots are not judged on content
            "is_remote": [False, False],
            "congestion_index": [0.1, 0.1],
            "avg_transit_hours_7d": [1.0, 1.0],
        }
    )


def test_an_order_whose_package_is_created_later_has_no_package_at_its_time():
    packages = pd.DataFrame(
        {
            "package_id": [1, 2, 3],
            "event_timestamp": pd.to_datetime(
                ["2026-11-28T09:00:00Z", "2026-11-28T10:00:00Z", "2026-11-28T12:30:00Z"], utc=True
            ),
        }
    )
    since = first_seen(PACKAGES, [packages.iloc[:2], packages.iloc[1:]])  # a key seen in two partitions: its first
    assert since.to_dict() == dict(zip([1, 2, 3], packages["event_timestamp"], strict=True))
    today = _orders([1, 2, 3, 4], [1, 2, 3, 99], ts=["2026-11-28T10:00:00Z"] * 4)
    out = with_derived_columns(ORDERS, today, date(2026, 11, 28), _history(today.iloc[:0], since))
    # 1: before; 2: at the same second (a join at or before finds it); 3: 2.5 h later; 99: the orphan check's
    assert out["_package_id_existed_at_event"].tolist() == [True, True, False, True]


def _hourly(rows_per_hour: int, days: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = rows_per_hour * 24 * days
    start = pd.Timestamp("2026-11-20", tz="UTC")
    seconds = rng.integers(0, 86_400, n) + 86_400 * rng.integers(0, days, n)
    return pd.DataFrame(
        {
            "package_id": np.arange(n),
            "event_timestamp": start + pd.to_timedelta(seconds, unit="s"),
            "weight_kg": rng.lognormal(0, 1, n),
            "volume_l": rng.lognormal(0, 1, n),
            "declared_value": np.where(rng.random(n) < 0.02, np.nan, 1.0),  # 2 % missing is this column's normal
            "category": "other",
            "is_bulky": False,
        }
    )


def test_an_hour_without_rows_or_without_a_column_is_named_and_noise_is_not():
    reference, today = _hourly(25, 7, seed=1), _hourly(25, 1, seed=2)
    assert hour_gaps(PACKAGES, today, reference) == []
    lost = today[today["event_timestamp"].dt.hour != 13]
    (gap,) = hour_gaps(PACKAGES, lost, reference)  # one line for the hour, not one per column
    assert (gap.column, gap.span, gap.present) == (ROWS, "13:00-14:00", 0) and 20 < gap.expected < 30
    assert "13:00-14:00 UTC has 0 rows" in gap.line("packages", "date=2026-11-28", 7)
    # One hour's declared values missing: ~4 % of the day, twice this column's usual share, named by its hour.
    outage = today.assign(declared_value=today["declared_value"].where(today["event_timestamp"].dt.hour != 9))
    (gap,) = hour_gaps(PACKAGES, outage, reference)
    assert (gap.column, gap.span, gap.present) == ("declared_value", "09:00-10:00", 0)
    rows_then = int(today["event_timestamp"].dt.hour.eq(9).sum())  # a column is judged on the rows that arrived
    assert gap.expected == pytest.approx(rows_then * gap.reference_share) and 0.9 < gap.reference_share < 1
    assert re.search(r"0 values, \d+\.\d expected \(9\d % of that hour's rows had one\)$", gap.line("p", "d", 7))
    # An hour lost across the clock hours (13:30-14:30) halves both: the hours starting on the half hour see it.
    minutes = today["event_timestamp"].dt.hour * 60 + today["event_timestamp"].dt.minute
    (gap,) = hour_gaps(PACKAGES, today[(minutes < 13 * 60 + 30) | (minutes >= 14 * 60 + 30)], reference)
    assert (gap.column, gap.span, gap.present) == (ROWS, "13:30-14:30", 0)
    # Two hours lost: one stretch, one line, its counts summed.
    (gap,) = hour_gaps(PACKAGES, today[~today["event_timestamp"].dt.hour.isin([13, 14])], reference)
    assert (gap.column, gap.span, gap.present) == (ROWS, "13:00-15:00", 0) and 40 < gap.expected < 60
    # Half an hour's rows lost and the rest complete: the rows are short, no column is blamed for it.
    half = today[~(today["event_timestamp"].dt.hour.eq(9) & today["event_timestamp"].dt.minute.lt(45))]
    assert [g.column for g in hour_gaps(PACKAGES, half, reference)] == [ROWS]


def test_a_column_is_not_blamed_for_rows_lost_in_the_half_hour_where_it_is_usually_set():
    # c is set on 90 % of the rows from 13:00 and on 20 % from 13:30 (history); today 13:00-13:40 lost its rows.
    past = np.zeros((BINS, 2), dtype="int64")
    past[:, 0], past[:, 1], past[27, 1] = 700, 630, 140
    now = past // 7
    now[26] = 0
    now[27] = now[27] * 4 // 6  # 13:30-13:40 lost too: rows and their values alike
    gaps = gaps_from_counts(["c"], now, past)
    assert [(g.column, g.span) for g in gaps] == [(ROWS, "13:00-13:30")], gaps  # the rows' finding only


def test_hour_gaps_stay_quiet_on_clean_days_and_thin_hours():
    # 200 clean days at 10 rows an hour against a week: by ALPHA a false finding is a one-in-a-million event.
    reference = _hourly(10, 7, seed=3)
    found = [g for seed in range(200) for g in hour_gaps(PACKAGES, _hourly(10, 1, seed=100 + seed), reference)]
    assert found == []
    # Half an hour's worth missing in a 4-row hour is too little to tell from noise; 25 of 25 missing is not.
    thin = _hourly(4, 1, seed=4)
    assert hour_gaps(PACKAGES, thin[thin["event_timestamp"].dt.hour != 5], _hourly(4, 7, seed=5)) == []
    assert ALPHA < 1e-5


def test_failure_lines_name_table_column_partition_and_numbers():
    result = {
        "success": False,
        "expectation_config": {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "weight_kg", "min_value": 0.01, "max_value": 1000.0},
            "meta": {"says": "values lie in [0.01, 1000.0]"},
        },
        "result": {"element_count": 600, "unexpected_count": 18, "partial_unexpected_list": [-40.75, -3.1]},
    }
    (entry,) = entries({"results": [result]})
    assert failure_line("packages", "date=2026-11-28", entry) == (
        "packages.weight_kg date=2026-11-28: expected values lie in [0.01, 1000.0]; "
        "18 of 600 rows (3.0 %) do not, e.g. -40.75, -3.1"
    )
    aggregate = {
        "success": False,
        "expectation_config": {
            "type": "expect_table_row_count_to_be_between",
            "kwargs": {"min_value": 300, "max_value": 1200},
            "meta": {"says": "the partition holds as many rows as its hours held in history"},
        },
        "result": {"observed_value": 0},
    }
    assert failure_line("orders", "date=2026-11-28", entries({"results": [aggregate]})[0]) == (
        "orders.table date=2026-11-28: expected the partition holds as many rows as its hours held in history; "
        "observed 0, allowed [300, 1200]"
    )


def test_ledger_approves_pinned_bytes_and_refuses_changed_or_unchecked_partitions(tmp_path):
    path = tmp_path / "orders/date=2026-11-28/part-0.parquet"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"checked bytes")
    part = PartitionFile("orders", date(2026, 11, 28), path)
    other = PartitionFile("orders", date(2026, 11, 29), path)
    book = PartitionLedger(tmp_path / "ledger.json")
    with pytest.raises(StepError, match=r"not passed validate-data: orders/date=2026-11-28;"):
        book.require([part], "materialize")
    book.approve([part], {part.name: sha256(path)}, "20261129T020000Z")
    book.require([part], "materialize")
    assert book.is_approved(part) and not book.is_approved(other)
    path.write_bytes(b"rewritten upstream")
    with pytest.raises(
        StepError, match=r"materialize .* changed since validate-data passed them: orders/date=2026-11-28 "
    ):
        book.require([part], "materialize")
    book.revoke([part])
    assert book.read() == {}
