"""Feast apply + materialize + freshness against the real SQLite and Redis online stores."""

from __future__ import annotations

import contextlib
import shutil
from datetime import timedelta

import pandas as pd
import pytest

from mlrelease.errors import StepError
from mlrelease.settings import Settings
from mlrelease.steps.apply_features import apply_features
from mlrelease.steps.check_freshness import check_freshness
from mlrelease.steps.materialize import materialize
from mlrelease.steps.validate_data import validate_data
from mlrelease.timewindow import Window, parse_timestamp
from tests.conftest import WINDOW_END, WINDOW_START

pytestmark = pytest.mark.integration
WINDOW = Window.parse(WINDOW_START, WINDOW_END)
OVERLAP = timedelta(hours=2)


@pytest.fixture(autouse=True)
def _keep_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # apply changes directory like `feast apply`; restore it afterwards


def _online_rows(store, entity_rows):
    return store.get_online_features(
        features=store.get_feature_service("parcel_eta_v1"), entity_rows=entity_rows
    ).to_df()


def _apply_and_materialize():
    settings = Settings.from_env()
    apply_features(settings)
    validate_data(settings, WINDOW, overlap=OVERLAP)  # materialize loads only partitions that passed
    return settings, materialize(settings, WINDOW, OVERLAP)


def test_materialize_loads_the_window_and_is_idempotent(home_with_data):
    from mlrelease.feast_store import open_store

    settings, first = _apply_and_materialize()
    assert set(first["views"]) == {"user_features", "package_features", "route_features"}
    assert first["views"]["route_features"]["rows_written"] == 200
    assert first["loaded_from"] == "2026-11-28T00:00:00+00:00"

    orders = pd.read_parquet(home_with_data / "data/offline/orders/date=2026-11-28")
    last = orders.iloc[-1]
    entity = {"user_id": int(last.user_id), "package_id": int(last.package_id), "route_id": int(last.route_id)}
    store = open_store(settings)
    before = _online_rows(store, [entity])
    assert before.notna().all(axis=None), before.T
    assert float(before["distance_km"][0]) > 0

    # An order placed after the window's end was not materialized.
    late = pd.read_parquet(home_with_data / "data/offline/packages/date=2026-11-29")
    late_pkg = int(late[late.event_timestamp > pd.Timestamp(WINDOW_END)].iloc[0].package_id)
    assert _online_rows(store, [{**entity, "package_id": late_pkg}])["weight_kg"].isna().all()

    materialize(settings, WINDOW, OVERLAP)  # the rerun must leave the online store exactly as it was
    pd.testing.assert_frame_equal(_online_rows(open_store(settings), [entity]), before)

    fresh = check_freshness(settings, parse_timestamp(WINDOW_END))
    assert fresh["views"]["route_features"]["lag_s"] <= 9 * 3600
    metrics = (home_with_data / "artifacts/parcel_eta/20261129T020000Z/freshness.prom").read_text()
    assert 'mlrelease_feature_fresh{feature_view="route_features"} 1.0' in metrics
    assert "mlrelease_feature_freshness_lag_seconds" in metrics


def test_stale_view_fails_freshness_naming_view_and_lag(home_with_data):
    # Nothing new arrived for two days: every view is as fresh as tonight's data, now two days old.
    settings, _ = _apply_and_materialize()
    later = parse_timestamp(WINDOW_END) + timedelta(days=2)
    with pytest.raises(StepError, match=r"stale features .*route_features lag \d+\.\dh > budget 9h"):
        check_freshness(settings, later)
    metrics = (home_with_data / "artifacts/parcel_eta/20261201T020000Z/freshness.prom").read_text()
    assert 'mlrelease_feature_fresh{feature_view="route_features"} 0.0' in metrics


def test_freshness_before_any_materialization_fails(home_with_data):
    apply_features(Settings.from_env())
    with pytest.raises(StepError, match="never materialized"):
        check_freshness(Settings.from_env(), parse_timestamp(WINDOW_END))


def test_materialize_refuses_partitions_that_did_not_pass_validate_data(home_with_data):
    settings = Settings.from_env()
    apply_features(settings)
    with pytest.raises(
        StepError,
        match=r"materialize reads only validated source partitions; not passed validate-data: [a-z]+/date=2026-11-2",
    ):
        materialize(settings, WINDOW, OVERLAP)
    assert not (home_with_data / "state/feast_watermarks.json").exists()  # nothing was loaded


def test_a_partition_rewritten_after_validation_is_refused_naming_both_digests(home_with_data):
    settings = Settings.from_env()
    apply_features(settings)
    validate_data(settings, WINDOW, overlap=OVERLAP)
    (home_with_data / "data/offline/users/date=2026-11-28/part-0.parquet").write_bytes(b"not parquet")
    with pytest.raises(
        StepError, match=r"changed since validate-data passed them: users/date=2026-11-28 \(sha256 [0-9a-f]{12}… then, "
    ):
        materialize(settings, WINDOW, OVERLAP)


def test_missing_partition_is_named(home_with_data):
    shutil.rmtree(home_with_data / "data/offline/routes/date=2026-11-28")
    settings = Settings.from_env()
    apply_features(settings)
    with pytest.raises(StepError, match=r"source routes: partition date=2026-11-28 is missing"):
        materialize(settings, WINDOW, OVERLAP)


def test_broken_feature_repo_fails_to_apply_with_a_clear_error(home_with_data, tmp_path, monkeypatch):
    from mlrelease.settings import REPO_ROOT

    repo = tmp_path / "broken_repo"
    shutil.copytree(REPO_ROOT / "feature_repo", repo)
    (repo / "features.py").write_text(
        (repo / "features.py").read_text().replace('join_keys=["route_id"]', 'join_keys=["route_id"], bogus=1')
    )
    monkeypatch.setenv("MLRELEASE_FEATURE_REPO", str(repo))
    with pytest.raises(StepError, match=r"broken_repo failed to apply: TypeError: .*bogus"):
        apply_features(Settings.from_env())


def test_view_removed_from_repo_is_deleted_and_no_longer_materialized(home_with_data, tmp_path, monkeypatch):
    import sqlite3

    from mlrelease.feast_store import open_store
    from mlrelease.settings import REPO_ROOT

    repo = tmp_path / "shrinking_repo"
    shutil.copytree(REPO_ROOT / "feature_repo", repo)
    monkeypatch.setenv("MLRELEASE_FEATURE_REPO", str(repo))
    settings, _ = _apply_and_materialize()
    online_db = home_with_data / "feast/online_store.db"

    def online_tables():
        with contextlib.closing(sqlite3.connect(online_db)) as conn:
            return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    assert "mlrelease_route_features" in online_tables()

    # Drop route_features, its entity and the feature service that reads it from the repo.
    source = (repo / "features.py").read_text()
    source = source[: source.index("route_features = FeatureView(")]  # the view and the service come last
    lines = [line for line in source.splitlines() if not line.startswith("route = Entity(")]
    (repo / "features.py").write_text("\n".join(lines) + "\n")
    # Both declared models read routes: the repo is refused, naming each one, and nothing changes.
    with pytest.raises(StepError, match="is not applied: ") as refused:
        apply_features(settings)
    for model, service in (("late_delivery", "late_delivery_v1"), ("parcel_eta", "parcel_eta_v1")):
        assert f"{model}/release.yaml: features.service '{service}' is not defined in the feature repo" in str(
            refused.value
        )
    assert "mlrelease_route_features" in online_tables()
    assert len(open_store(settings).list_feature_services()) == 2
    # With no model reading it (specs=()), the shrink is applied.
    result = apply_features(settings, specs=())

    assert result["feature_views"] == ["package_features", "user_features"]
    assert result["removed"]["feature_views"] == ["route_features"]
    assert result["removed"]["feature_services"] == ["late_delivery_v1", "parcel_eta_v1"]
    assert result["removed"]["entities"] == ["route"]
    assert result["removed"]["data_sources"] == ["routes_source"]
    store = open_store(settings)
    assert {fv.name for fv in store.list_feature_views()} == {"user_features", "package_features"}
    assert store.list_feature_services() == []
    assert "mlrelease_route_features" not in online_tables()  # the removed view's online table is dropped

    assert set(materialize(settings, WINDOW, OVERLAP)["views"]) == {"user_features", "package_features"}
    assert set(check_freshness(settings, parse_timestamp(WINDOW_END))["views"]) == {"user_features", "package_features"}
    assert apply_features(settings, specs=())["removed"] == {key: [] for key in result["removed"]}  # a rerun: none


def test_a_repo_that_drops_a_feature_a_model_reads_is_refused(home_with_data, tmp_path, monkeypatch):
    from mlrelease.feast_store import open_store
    from mlrelease.settings import REPO_ROOT

    repo = tmp_path / "narrower_repo"
    shutil.copytree(REPO_ROOT / "feature_repo", repo)
    monkeypatch.setenv("MLRELEASE_FEATURE_REPO", str(repo))
    settings = Settings.from_env()
    apply_features(settings)
    source = (repo / "features.py").read_text()
    assert source.count("        route_features,\n") == 1  # the late-delivery service reads the whole view
    narrower = 'route_features[["region", "distance_km", "is_remote", "avg_transit_hours_7d"]],\n'
    (repo / "features.py").write_text(source.replace("        route_features,\n", "        " + narrower))
    with pytest.raises(StepError) as refused:
        apply_features(settings)
    assert str(refused.value).endswith(
        "late_delivery/release.yaml: features.columns ['congestion_index'] are not features of service "
        "'late_delivery_v1' (it provides ['avg_transit_hours_7d', 'category', 'distance_km', 'is_bulky', 'is_remote', "
        "'region', 'tier', 'volume_l', 'weight_kg'])"
    )
    service = open_store(settings).get_feature_service("late_delivery_v1")  # the registry keeps the old one
    assert "congestion_index" in {f.name for p in service.feature_view_projections for f in p.features}


def test_redis_online_store(home_with_data, redis_url, monkeypatch):
    import redis

    from mlrelease.feast_store import open_store

    redis.Redis.from_url(f"redis://{redis_url}").flushall()
    monkeypatch.setenv("MLRELEASE_ONLINE_STORE", "redis")
    monkeypatch.setenv("MLRELEASE_REDIS_URL", redis_url)
    settings, result = _apply_and_materialize()
    assert result["online_store"] == "redis"
    assert redis.Redis.from_url(f"redis://{redis_url}").dbsize() > 0
    orders = pd.read_parquet(home_with_data / "data/offline/orders/date=2026-11-28")
    row = orders.iloc[-1]
    online = _online_rows(
        open_store(settings),
        [{"user_id": int(row.user_id), "package_id": int(row.package_id), "route_id": int(row.route_id)}],
    )
    routes = pd.read_parquet(home_with_data / "data/offline/routes/date=2026-11-28")
    expected = routes[routes.route_id == row.route_id]["distance_km"].iloc[0]
    assert float(online["distance_km"][0]) == pytest.approx(expected)
    check_freshness(settings, parse_timestamp(WINDOW_END))


def test_unreachable_redis_fails_clearly(home_with_data, monkeypatch):
    from tests.conftest import free_port

    monkeypatch.setenv("MLRELEASE_ONLINE_STORE", "redis")
    monkeypatch.setenv("MLRELEASE_REDIS_URL", f"127.0.0.1:{free_port()}")
    settings = Settings.from_env()
    with pytest.raises(StepError, match=r"failed to apply: ConnectionError|materializing .* failed: ConnectionError"):
        apply_features(settings)
        validate_data(settings, WINDOW, overlap=OVERLAP)
        materialize(settings, WINDOW, OVERLAP)
