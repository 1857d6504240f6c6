"""Every class of corrupted batch, run through the DAG's data half on real Feast stores (SQLite and Redis).

The previous night was validated and materialized; tonight's two partitions are then corrupted the way
upstream jobs break them. validate-data must stop each one with a line naming table, column and partition,
materialize must refuse the window, and the online store must be exactly as the previous night left it.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import GateFailed, StepError
from mlrelease.settings import Settings
from mlrelease.steps.apply_features import apply_features
from mlrelease.steps.materialize import materialize
from mlrelease.steps.validate_data import validate_data
from mlrelease.storage import sha256
from mlrelease.timewindow import Window
from tests.conftest import ROWS_PER_DAY, WINDOW_END, WINDOW_START, redis_digest

pytestmark = pytest.mark.integration
TONIGHT = Window.parse(WINDOW_START, WINDOW_END)
LAST_NIGHT = Window(TONIGHT.start - timedelta(days=1), TONIGHT.end - timedelta(days=1))
OVERLAP = timedelta(hours=2)
DAYS = ("2026-11-28", "2026-11-29")

# mode -> a line validate-data must report (table.column date=…: what was expected; what was seen)
EXPECTED = {
    "nulls": r"users\.tier date=2026-11-28: expected no value is missing; \d+ of 300 rows",
    "drift": r"routes\.distance_km date=2026-11-28: drift PSI \d+\.\d+ > 0\.25",
    "schema": r"routes\.distance_km date=2026-11-28: missing column distance_km",
    "stale": r"routes\.table date=2026-11-29: expected the partition holds as many rows as its hours held in "
    r"history; observed 0, allowed \[100, 400\]",
    "duplicates": r"orders\.order_id date=2026-11-28: expected keys are unique within the partition",
    "late_events": r"packages\.event_timestamp date=2026-11-28: expected every event time lies inside its "
    r"partition's day; 90 of 600 rows",
    "empty_partition": r"orders\.table date=2026-11-28: expected the partition holds .*; observed 0",
    "stuck_column": r"routes\.congestion_index date=2026-11-28: expected the spread has not collapsed; observed 0",
    "republished": r"orders\.order_id date=2026-11-28: expected no key .* re-appears from an earlier partition; "
    r"600 of 600 rows",
    "orphans": r"orders\.package_id date=2026-11-28: expected every order references a package present in "
    r"packages; 30 of 600 rows",
    "naive_timestamps": r"orders\.event_timestamp date=2026-11-28: type timestamp\[us\] has no time zone",
    "units": r"packages\.weight_kg date=2026-11-28: expected the mean is in its usual range \(units unchanged\)",
    "negative_values": r"packages\.weight_kg date=2026-11-28: expected values lie in \[0\.01, 1000\]; 18 of 600 "
    r"rows \(3\.0 %\) do not, e\.g\. -",
    "republished_new_ids": r"orders\.order_id date=2026-11-28: expected the rows are not copies under new keys of rows "
    r"earlier in this or an earlier partition \(every value but the ids and the event time\); 600 of 600 rows",
    "appended_twice": r"packages\.package_id date=2026-11-28: expected the rows are not copies under new keys .*; "
    r"600 of 1200 rows \(50\.0 %\) do not",
    "packages_after_orders": r"orders\.package_id date=2026-11-28: expected every order's package has a row at or "
    r"before the order's event time \(what a point-in-time join finds\); \d\d of 600 rows",
    "feed_outage": r"orders\.table date=2026-11-28: expected every hour of the day as complete as the same hour of 7 "
    r"reference days; 13:00-14:00 UTC has 0 rows, 2\d\.\d expected",
}


def _online(settings: Settings) -> pd.DataFrame:
    """Features the gateway would read for a fixed set of entities of last night."""
    from mlrelease.feast_store import open_store

    orders = pd.read_parquet(settings.offline_dir / "orders/date=2026-11-27")
    rows = [
        {"user_id": int(r.user_id), "package_id": int(r.package_id), "route_id": int(r.route_id)}
        for r in orders.tail(20).itertuples()
    ]
    store = open_store(settings)
    return store.get_online_features(features=store.get_feature_service("parcel_eta_v1"), entity_rows=rows).to_df()


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def last_night(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, clean_offline: Path
) -> Iterator[str]:
    """An MLRELEASE_HOME whose online store (SQLite, then a real Redis) holds last night's validated window.

    Shared by the module's tests, which restore tonight's partitions after corrupting them.
    """
    store = request.param
    home = tmp_path_factory.mktemp(f"data-gates-{store}")
    shutil.copytree(clean_offline, home / "data/offline")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLRELEASE_HOME", str(home))
        mp.setenv("MLRELEASE_XCOM_PATH", str(home / "xcom/return.json"))
        mp.delenv("MLRELEASE_ONLINE_STORE", raising=False)
        if store == "redis":
            import redis

            url = request.getfixturevalue("redis_url")
            redis.Redis.from_url(f"redis://{url}").flushall()
            mp.setenv("MLRELEASE_ONLINE_STORE", "redis")
            mp.setenv("MLRELEASE_REDIS_URL", url)
        mp.chdir(home)  # apply changes directory like `feast apply`
        settings = Settings.from_env()
        apply_features(settings)
        validate_data(settings, LAST_NIGHT, overlap=OVERLAP)
        materialize(settings, LAST_NIGHT, OVERLAP)
        yield store


def _store_digest(settings: Settings) -> str:
    """A digest of the whole online store: the SQLite file, or every Redis key with its serialized value."""
    if settings.online_store == "sqlite":
        return sha256(settings.home / "feast/online_store.db")
    import redis

    assert redis.Redis.from_url(f"redis://{settings.redis_url}").keys("*"), "last night's features must be in Redis"
    return redis_digest(settings.redis_url)


def _restore_tonight(offline: Path, clean_offline: Path) -> None:
    for table in ("users", "packages", "routes", "orders"):
        for day in DAYS:
            shutil.copy(
                clean_offline / table / f"date={day}/part-0.parquet", offline / table / f"date={day}/part-0.parquet"
            )


def _stopped_before_the_store(settings: Settings, mode: str) -> str:
    """Corrupt tonight, run validate-data then materialize as the DAG orders them; the gate's message."""
    generate(
        settings.offline_dir, TONIGHT.start.date(), TONIGHT.end.date(), rows_per_day=ROWS_PER_DAY, seed=11, inject=mode
    )
    with pytest.raises(GateFailed) as verdict:
        validate_data(settings, TONIGHT, overlap=OVERLAP)
    message = str(verdict.value)
    assert "\n" not in message and message.startswith("data quality failed (")
    with pytest.raises(
        StepError, match=r"materialize reads only validated source partitions; not passed validate-data"
    ):
        materialize(settings, TONIGHT, OVERLAP)  # a retry or a hand run cannot load it either
    run_dir = settings.artifacts_dir / "20261129T020000Z/data_quality"
    return "\n".join(json.loads((run_dir / "validation.json").read_text())["failures"])


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_online_store_is_untouched_by_a_corrupted_window(last_night, clean_offline, mode):
    settings = Settings.from_env()
    assert settings.online_store == last_night
    before, digest = _online(settings), _store_digest(settings)
    try:
        findings = _stopped_before_the_store(settings, mode)
        assert re.search(EXPECTED[mode], findings), findings
        assert _store_digest(settings) == digest  # not one byte of the online store changed
        pd.testing.assert_frame_equal(_online(settings), before)
    finally:
        _restore_tonight(settings.offline_dir, clean_offline)
