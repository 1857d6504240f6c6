"""Deterministic synthetic parcel-delivery data, written as date-partitioned parquet.

Every day is generated from its own seeded random stream, so generating a range in one call or
day by day gives identical files, and rerunning a day rewrites the same bytes (idempotent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from mlrelease.data.schema import PACKAGE_CATEGORIES, REGIONS, TABLES, USER_TIERS
from mlrelease.storage import write_parquet_atomic

log = logging.getLogger(__name__)

N_ROUTES = 200
AGE_EPOCH = date(2026, 1, 1)  # account ages grow by one day per day from their age on this date
STALE_HOURS = 36  # how far behind the end of the range the `stale` injection stops route updates
# Delivery promises are quoted in whole half-days from what the shop knows at order time (the route's distance,
# whether it is remote, whether the parcel is bulky), so about a quarter of the parcels arrive later than promised.
PROMISE_STEP_HOURS = 12


@dataclass(frozen=True)
class Population:
    """The long-lived users and routes that orders are drawn from (fixed for a seed)."""

    user_tier: np.ndarray
    user_age_days: np.ndarray
    route_region: np.ndarray
    route_distance_km: np.ndarray
    route_is_remote: np.ndarray

    @property
    def n_users(self) -> int:
        """Number of users."""
        return len(self.user_tier)


def make_population(seed: int, n_users: int) -> Population:
    """Build the static user and route attributes for a seed."""
    rng = np.random.default_rng([seed, 0])
    tier = rng.choice(USER_TIERS, size=n_users, p=[0.70, 0.22, 0.08])
    age = rng.integers(1, 3_000, size=n_users)
    region = rng.choice(REGIONS, size=N_ROUTES, p=[0.22, 0.22, 0.2, 0.2, 0.1, 0.06])
    # Remote routes are islands plus a share of the rest: the long tail of the network.
    remote = (region == "islands") | (rng.random(N_ROUTES) < 0.10)
    distance = rng.lognormal(mean=5.2, sigma=0.6, size=N_ROUTES) * np.where(remote, 2.2, 1.0)
    return Population(tier, age, region, np.clip(distance, 1.0, 4_900.0).round(1), remote)


def _day_rng(seed: int, day: date, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, day.toordinal(), stream])


def _midnight(day: date) -> pd.Timestamp:
    return pd.Timestamp(datetime(day.year, day.month, day.day, tzinfo=UTC))


def users_for_day(pop: Population, seed: int, day: date) -> pd.DataFrame:
    """One daily snapshot row per user, taken around 01:00 UTC."""
    rng = _day_rng(seed, day, 1)
    n = pop.n_users
    tier_rate = pd.Series(pop.user_tier).map({"standard": 2.0, "plus": 5.0, "premium": 12.0}).to_numpy()
    tier_value = pd.Series(pop.user_tier).map({"standard": 60.0, "plus": 180.0, "premium": 900.0}).to_numpy()
    return pd.DataFrame(
        {
            "user_id": np.arange(1, n + 1, dtype="int64"),
            "event_timestamp": _midnight(day) + pd.to_timedelta(60 + rng.integers(0, 30, n), unit="m"),
            "tier": pop.user_tier.astype(str),
            "account_age_days": np.maximum(pop.user_age_days + (day - AGE_EPOCH).days, 0).astype("int64"),
            "orders_30d": rng.poisson(tier_rate).astype("int64"),
            "avg_declared_value_30d": (tier_value * rng.lognormal(0, 0.4, n)).round(2),
        }
    )


def routes_for_day(pop: Population, seed: int, day: date) -> pd.DataFrame:
    """Route snapshots every six hours (congestion and recent transit time change during the day)."""
    rng = _day_rng(seed, day, 2)
    frames = []
    for hour in (0, 6, 12, 18):
        rush = 0.25 if hour in (6, 12) else 0.05
        congestion = np.clip(rng.beta(2, 5, N_ROUTES) + rush, 0, 1)
        transit = pop.route_distance_km / 55 * (1 + 0.8 * congestion) + 20 * pop.route_is_remote
        frames.append(
            pd.DataFrame(
                {
                    "route_id": np.arange(1, N_ROUTES + 1, dtype="int64"),
                    "event_timestamp": _midnight(day)
                    + pd.Timedelta(hours=hour)
                    + pd.to_timedelta(rng.integers(0, 30, N_ROUTES), unit="m"),
                    "region": pop.route_region.astype(str),
                    "distance_km": pop.route_distance_km,
                    "is_remote": pop.route_is_remote,
                    "congestion_index": congestion.round(4),
                    "avg_transit_hours_7d": (transit * rng.lognormal(0, 0.1, N_ROUTES)).round(2),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def orders_and_packages_for_day(
    pop: Population, seed: int, day: date, rows: int, routes: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Orders placed during the day, each with its own package, the delivery time promised and the one it took."""
    rng = _day_rng(seed, day, 3)
    # Premium users order more often: weight the draw by tier.
    weights = pd.Series(pop.user_tier).map({"standard": 1.0, "plus": 2.0, "premium": 5.0}).to_numpy()
    user_idx = rng.choice(pop.n_users, size=rows, p=weights / weights.sum())
    route_idx = rng.integers(0, N_ROUTES, size=rows)
    ts = _midnight(day) + pd.to_timedelta(np.sort(rng.integers(0, 86_400, rows)), unit="s")
    order_id = day.toordinal() * 1_000_000 + np.arange(1, rows + 1, dtype="int64")

    category = rng.choice(PACKAGE_CATEGORIES, size=rows, p=[0.15, 0.2, 0.25, 0.15, 0.05, 0.05, 0.15])
    furniture = category == "furniture"
    weight = np.clip(rng.lognormal(0.5, 0.9, rows) * np.where(furniture, 12, 1), 0.05, 900).round(2)
    volume = np.clip(weight * rng.lognormal(1.3, 0.5, rows), 0.05, 4_900).round(1)
    bulky = furniture | (volume > 150)
    tier = pop.user_tier[user_idx]
    value_scale = np.select([tier == "premium", tier == "plus"], [900.0, 180.0], 60.0)
    declared = np.clip(rng.lognormal(0, 0.8, rows) * value_scale, 1, 99_000).round(2)

    # Congestion at order time: the latest route snapshot of the day at or before the order.
    hours = np.minimum(ts.hour.to_numpy() // 6, 3)
    congestion = routes["congestion_index"].to_numpy().reshape(4, N_ROUTES)[hours, route_idx]
    remote = pop.route_is_remote[route_idx]
    eta = (
        8.0
        + pop.route_distance_km[route_idx] / 55 * (1 + 0.8 * congestion)
        + 20.0 * remote
        + 6.0 * bulky
        + 0.05 * weight
        - 3.0 * (tier == "premium")
        + rng.gamma(2.0, np.where(remote, 4.0, 1.5))
    )
    eta_hours = np.clip(eta, 0.5, 499).round(3)
    quoted = 9.0 + pop.route_distance_km[route_idx] / 55 * 1.25 + 22.0 * remote + 6.0 * bulky
    promised = PROMISE_STEP_HOURS * np.ceil(quoted / PROMISE_STEP_HOURS)
    packages = pd.DataFrame(
        {
            "package_id": order_id,
            "event_timestamp": ts,
            "weight_kg": weight,
            "volume_l": volume,
            "declared_value": declared,
            "category": category.astype(str),
            "is_bulky": bulky,
        }
    )
    orders = pd.DataFrame(
        {
            "order_id": order_id,
            "event_timestamp": ts,
            "user_id": (user_idx + 1).astype("int64"),
            "package_id": order_id,
            "route_id": (route_idx + 1).astype("int64"),
            "eta_hours": eta_hours,
            "promised_hours": promised.astype("float64"),
            "is_late": eta_hours > promised,  # the late-delivery model's label
        }
    )
    return orders, packages


def generate_day(pop: Population, seed: int, day: date, rows: int) -> dict[str, pd.DataFrame]:
    """All four tables for one day."""
    routes = routes_for_day(pop, seed, day)
    orders, packages = orders_and_packages_for_day(pop, seed, day, rows, routes)
    return {"users": users_for_day(pop, seed, day), "routes": routes, "orders": orders, "packages": packages}


# --- corruptions, each the thing its name says -------------------------------------------------
# Every injector models one real upstream ETL break. It edits (or replaces entries of) one day's
# `tables` in place, drawing any randomness only from `rng`, which is seeded per day, so the
# corrupted files are as deterministic as the clean ones.


@dataclass(frozen=True)
class InjectContext:
    """What an injector may need to know about the day being written and the generate call."""

    day: date  # the day whose partitions are being written
    range_start: date  # the first day of the generate call (`start`)
    range_end: pd.Timestamp  # midnight UTC after the last day of the generate call (exclusive end)
    seed: int
    pop: Population
    rows: int  # rows_per_day


Injector = Callable[[dict[str, pd.DataFrame], np.random.Generator, InjectContext], None]

LATE_SHARE = 0.15  # `late_events`: share of orders/packages whose event_timestamp arrives late
LATE_DAYS = 3  # ... and by how many days
STUCK_CONGESTION = 0.35  # `stuck_column`: the one value routes.congestion_index is stuck at
ORPHAN_SHARE = 0.05  # `orphans`: share of orders pointing at a package that exists nowhere
# Real ids are day.toordinal() * 1_000_000 + n, below (date.max.toordinal() + 1) * 1_000_000 < 3.7e12 for any
# day and any n < 1_000_000, so offsetting a real id by 10**13 can never land on one (and stays far inside int64).
ORPHAN_ID_OFFSET = 10**13
LB_PER_KG = 2.20462  # `units`: weight_kg written in pounds
NEGATIVE_SHARE = 0.03  # `negative_values`: share of packages whose weight_kg is negated
LATE_PACKAGE_SHARE = 0.10  # `packages_after_orders`: share of orders whose package is created after the order
LATE_PACKAGE_HOURS = (1, 3)  # ... by this many hours (uniform), staying inside the day
OUTAGE_HOUR = 13  # `feed_outage`: the hour of the day (UTC) whose orders and packages never arrive


def _pick_rows(rng: np.random.Generator, n: int, share: float) -> np.ndarray:
    """A boolean mask over n rows that is True on exactly round(share * n) of them, drawn from rng."""
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=round(share * n), replace=False)] = True
    return mask


def _inject_nulls(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """About 20% nulls in routes.distance_km, packages.weight_kg and users.tier."""
    for name, col in (("routes", "distance_km"), ("packages", "weight_kg"), ("users", "tier")):
        df = tables[name]
        mask = rng.random(len(df)) < 0.2
        df[col] = df[col].astype("object" if col == "tier" else "float64").where(~mask, None)


def _inject_drift(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """Distribution shift: longer routes, more congestion, heavier packages."""
    routes, packages = tables["routes"], tables["packages"]
    routes["distance_km"] = (routes["distance_km"] * 2.5).clip(upper=4_900).round(1)
    routes["congestion_index"] = (routes["congestion_index"] * 0.5 + 0.5).round(4)
    packages["weight_kg"] = (packages["weight_kg"] * 4).clip(upper=900).round(2)


def _inject_schema(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """An upstream rename and a type change: the two schema breaks seen most in practice."""
    tables["routes"] = tables["routes"].rename(columns={"distance_km": "distance_miles"})
    tables["packages"]["weight_kg"] = tables["packages"]["weight_kg"].astype(str)


def _inject_stale(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """Route updates stop STALE_HOURS before the end of the range."""
    routes = tables["routes"]
    cutoff = ctx.range_end - pd.Timedelta(hours=STALE_HOURS)
    tables["routes"] = routes[routes["event_timestamp"] < cutoff].reset_index(drop=True)


def _inject_duplicates(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """5% of the day's orders are written twice."""
    orders = tables["orders"]
    dupes = orders.sample(frac=0.05, random_state=int(rng.integers(0, 2**31)))
    tables["orders"] = pd.concat([orders, dupes], ignore_index=True).sort_values("event_timestamp")


def _inject_late_events(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """LATE_SHARE of the day's orders and their packages (the same rows) get event_timestamp LATE_DAYS later.

    Models a backfill that files events by load date: those rows sit in a partition that is not their day.
    """
    orders, packages = tables["orders"], tables["packages"]
    late = _pick_rows(rng, len(orders), LATE_SHARE)
    for frame in (orders, packages):  # row i is the same order/package in both tables
        ts = frame["event_timestamp"]
        frame["event_timestamp"] = ts.where(~late, ts + pd.Timedelta(days=LATE_DAYS))


def _inject_empty_partition(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """On the first day of the range only, orders and packages are written with zero rows (same schema).

    Models an extract that ran before its source had landed: the partition exists but is empty.
    """
    if ctx.day == ctx.range_start:
        for name in ("orders", "packages"):
            tables[name] = tables[name].iloc[0:0]


def _inject_stuck_column(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """routes.congestion_index is the constant STUCK_CONGESTION for every row (a sensor/feed stuck on one value)."""
    routes = tables["routes"]
    routes["congestion_index"] = np.full(len(routes), STUCK_CONGESTION, dtype="float64")


def _inject_republished(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """Each day's orders and packages are the previous day's, with event_timestamp moved one day forward.

    Models an upstream job re-publishing yesterday's extract under today's date: the rows sit inside
    today's partition but carry exactly yesterday's order_id/package_id values.
    """
    previous = generate_day(ctx.pop, ctx.seed, ctx.day - timedelta(days=1), ctx.rows)
    for name in ("orders", "packages"):
        frame = previous[name]
        frame["event_timestamp"] = frame["event_timestamp"] + pd.Timedelta(days=1)
        tables[name] = frame


def _inject_orphans(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """ORPHAN_SHARE of orders point at a package_id (real id + ORPHAN_ID_OFFSET) that no packages partition holds.

    Models a broken foreign key: orders loaded while their packages were dropped or never shipped.
    """
    orders = tables["orders"]
    orphan = _pick_rows(rng, len(orders), ORPHAN_SHARE)
    orders["package_id"] = orders["package_id"].where(~orphan, orders["package_id"] + ORPHAN_ID_OFFSET)


def _inject_naive_timestamps(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """Every table's event_timestamp is written timezone-naive (UTC wall clock, no zone in the parquet type).

    Models a writer that drops the zone: readers must guess what the timestamps mean.
    """
    for frame in tables.values():
        frame["event_timestamp"] = frame["event_timestamp"].dt.tz_convert("UTC").dt.tz_localize(None)


def _inject_units(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """packages.weight_kg is written in pounds (x LB_PER_KG, rounded to 2 decimals) under its old name."""
    packages = tables["packages"]
    packages["weight_kg"] = (packages["weight_kg"] * LB_PER_KG).round(2)


def _inject_negative_values(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """NEGATIVE_SHARE of packages get weight_kg negated (a sign bug upstream: -40.75 instead of 40.75)."""
    packages = tables["packages"]
    negative = _pick_rows(rng, len(packages), NEGATIVE_SHARE)
    packages["weight_kg"] = packages["weight_kg"].where(~negative, -packages["weight_kg"])


def _renumbered(frames: tuple[pd.DataFrame, pd.DataFrame], day: date, first: int) -> None:
    """Give orders and their packages (row i is the same order in both) new ids of `day`, from `first` on."""
    ids = day.toordinal() * 1_000_000 + first + np.arange(len(frames[0]), dtype="int64")
    orders, packages = frames
    orders["order_id"] = ids
    orders["package_id"] = ids
    packages["package_id"] = ids


def _inject_republished_new_ids(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """Each day's orders and packages are the previous day's, one day later and under today's new ids.

    Models an upstream job re-publishing yesterday's extract with freshly minted keys: nothing matches by key.
    """
    previous = generate_day(ctx.pop, ctx.seed, ctx.day - timedelta(days=1), ctx.rows)
    for name in ("orders", "packages"):
        previous[name]["event_timestamp"] = previous[name]["event_timestamp"] + pd.Timedelta(days=1)
    _renumbered((previous["orders"], previous["packages"]), ctx.day, 1)
    tables["orders"], tables["packages"] = previous["orders"], previous["packages"]


def _inject_appended_twice(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """The day's orders and packages are appended a second time under new ids (the partition doubles)."""
    copies = tables["orders"].copy(), tables["packages"].copy()
    _renumbered(copies, ctx.day, ctx.rows + 1)  # after the day's real ids
    for name, copy in zip(("orders", "packages"), copies, strict=True):
        tables[name] = pd.concat([tables[name], copy], ignore_index=True).sort_values("event_timestamp")


def _inject_late_packages(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """LATE_PACKAGE_SHARE of packages are created 1-3 hours after their order (within the same day).

    Models a packages feed stamped with its load time: the package exists that day, but not yet at the order's
    time, so a point-in-time join finds no package row for the order.
    """
    orders, packages = tables["orders"], tables["packages"]
    delay = pd.to_timedelta(rng.uniform(*LATE_PACKAGE_HOURS, len(packages)), unit="h").round("s")
    fits = (orders["event_timestamp"] + delay) < _midnight(ctx.day + timedelta(days=1))
    late = _pick_rows(rng, len(packages), LATE_PACKAGE_SHARE) & fits.to_numpy()
    packages["event_timestamp"] = packages["event_timestamp"].where(~late, packages["event_timestamp"] + delay)


def _inject_feed_outage(tables: dict[str, pd.DataFrame], rng: np.random.Generator, ctx: InjectContext) -> None:
    """The orders feed lost OUTAGE_HOUR:00-:59 UTC: that hour's orders and packages never arrive (~4 % of the day)."""
    for name in ("orders", "packages"):
        frame = tables[name]
        tables[name] = frame[frame["event_timestamp"].dt.hour != OUTAGE_HOUR].reset_index(drop=True)


INJECTORS: dict[str, Injector] = {
    "nulls": _inject_nulls,
    "drift": _inject_drift,
    "schema": _inject_schema,
    "stale": _inject_stale,
    "duplicates": _inject_duplicates,
    "late_events": _inject_late_events,
    "empty_partition": _inject_empty_partition,
    "stuck_column": _inject_stuck_column,
    "republished": _inject_republished,
    "orphans": _inject_orphans,
    "naive_timestamps": _inject_naive_timestamps,
    "units": _inject_units,
    "negative_values": _inject_negative_values,
    "republished_new_ids": _inject_republished_new_ids,
    "appended_twice": _inject_appended_twice,
    "packages_after_orders": _inject_late_packages,
    "feed_outage": _inject_feed_outage,
}
INJECT_MODES = tuple(INJECTORS)


def partition_path(offline_dir: Path, table: str, day: date) -> Path:
    """Where one day of one table lives: `<offline_dir>/<table>/date=YYYY-MM-DD/part-0.parquet`."""
    return offline_dir / table / f"date={day.isoformat()}" / "part-0.parquet"


def generate(
    offline_dir: Path,
    start: date,
    end: date,
    *,
    rows_per_day: int = 2_000,
    seed: int = 7,
    inject: str | None = None,
) -> dict[str, int]:
    """Write every table for each day in [start, end] (inclusive); returns rows written per table."""
    if end < start:
        raise ValueError(f"--end {end} is before --start {start}")
    if rows_per_day < 1:
        raise ValueError(f"--rows-per-day must be positive, got {rows_per_day}")
    if inject is not None and inject not in INJECTORS:
        raise ValueError(f"unknown --inject {inject!r}; choose one of {', '.join(INJECT_MODES)}")
    pop = make_population(seed, n_users=max(200, rows_per_day // 2))
    range_end = _midnight(end + timedelta(days=1))
    totals = dict.fromkeys(TABLES, 0)
    day = start
    while day <= end:
        tables = generate_day(pop, seed, day, rows_per_day)
        if inject is not None:
            ctx = InjectContext(day, start, range_end, seed, pop, rows_per_day)
            INJECTORS[inject](tables, _day_rng(seed, day, 99), ctx)
        for name, frame in tables.items():
            # Pandas' string dtype keeps the arrow type `string` even for an empty or all-null column.
            text_columns = frame.select_dtypes(include="object").columns
            frame = frame.astype(dict.fromkeys(text_columns, "string"))
            # Microseconds, as Spark and Hive write them: Spark cannot read nanosecond timestamps at all.
            write_parquet_atomic(frame, partition_path(offline_dir, name, day), timestamp_unit="us")
            totals[name] += len(frame)
        day += timedelta(days=1)
    log.info("generated %s days into %s: %s", (end - start).days + 1, offline_dir, totals)
    return totals
