import time
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mlrelease.errors import StepError
from mlrelease.freshness import assess, parse_budget_hours
from mlrelease.settings import Settings
from mlrelease.steps.check_freshness import (
    PUSHGATEWAY_ENV,
    freshness_registry,
    pushgateway_url,
    write_freshness_metrics,
)

END = datetime(2026, 11, 29, 2, tzinfo=UTC)


def test_fresh_within_budget_and_stale_beyond():
    ok = assess("route_features", timedelta(hours=9), END - timedelta(hours=2), END)
    stale = assess("route_features", timedelta(hours=9), END - timedelta(hours=20), END)
    assert ok.ok and ok.lag == timedelta(hours=2)
    assert not stale.ok and stale.describe() == "route_features lag 20.0h > budget 9h"


def test_never_materialized_is_stale_and_future_events_have_no_negative_lag():
    missing = assess("user_features", timedelta(hours=1), None, END)
    assert not missing.ok and "never materialized" in missing.describe()
    assert assess("v", timedelta(hours=1), END + timedelta(hours=1), END).lag == timedelta(0)


def test_budget_tag_parsing_names_the_view():
    assert parse_budget_hours("v", {"freshness_budget_hours": "6"}) == timedelta(hours=6)
    with pytest.raises(ValueError, match="feature view v has no freshness_budget_hours"):
        parse_budget_hours("v", {})
    with pytest.raises(ValueError, match="non-numeric"):
        parse_budget_hours("v", {"freshness_budget_hours": "soon"})
    with pytest.raises(ValueError, match="non-positive"):
        parse_budget_hours("v", {"freshness_budget_hours": "0"})


def _families(registry) -> dict[str, dict[tuple, float]]:
    """{metric family: {label values: sample value}} as Prometheus would parse the exposition."""
    text = generate_latest(registry).decode()
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def test_registry_exports_event_and_check_timestamps_that_prometheus_can_age():
    newest = END - timedelta(hours=2)
    results = [
        assess("route_features", timedelta(hours=9), newest, END),
        assess("user_features", timedelta(hours=36), None, END),
    ]
    families = _families(freshness_registry(results, checked_at=1_800_000_000.5))
    last_event = families["mlrelease_feature_last_event_timestamp_seconds"]
    assert last_event[(("feature_view", "route_features"),)] == newest.timestamp()
    assert last_event[(("feature_view", "user_features"),)] == 0.0  # never materialized: the epoch, so alerts fire
    assert families["mlrelease_feature_freshness_check_timestamp_seconds"] == {(): 1_800_000_000.5}
    # the existing gauges are still there, unchanged
    assert families["mlrelease_feature_freshness_lag_seconds"][(("feature_view", "route_features"),)] == 7200.0
    assert families["mlrelease_feature_freshness_budget_seconds"][(("feature_view", "user_features"),)] == 36 * 3600
    assert families["mlrelease_feature_fresh"] == {
        (("feature_view", "route_features"),): 1.0,
        (("feature_view", "user_features"),): 0.0,
    }


def test_textfile_stamps_the_check_with_the_wall_clock(tmp_path):
    path = tmp_path / "run" / "freshness.prom"
    before = time.time()
    write_freshness_metrics([assess("route_features", timedelta(hours=9), END, END)], path)
    after = time.time()
    samples = {s.name: s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples}
    assert before <= samples["mlrelease_feature_freshness_check_timestamp_seconds"] <= after
    assert samples["mlrelease_feature_last_event_timestamp_seconds"] == END.timestamp()


def test_pushgateway_url_is_optional_and_validated(monkeypatch):
    monkeypatch.delenv(PUSHGATEWAY_ENV, raising=False)
    assert pushgateway_url(Settings.from_env().pushgateway_url) is None
    for good in ("http://pushgateway:9091", "pushgateway:9091", "https://pg.example.com"):
        monkeypatch.setenv(PUSHGATEWAY_ENV, good)
        assert pushgateway_url(Settings.from_env().pushgateway_url) == good
    for bad in ("ftp://pushgateway:9091", "http://:9091", "pushgateway:ninety", "http:///metrics"):
        monkeypatch.setenv(PUSHGATEWAY_ENV, bad)
        with pytest.raises(StepError, match=f"{PUSHGATEWAY_ENV} must be an http\\(s\\) URL"):
            pushgateway_url(Settings.from_env().pushgateway_url)
