from datetime import UTC, datetime, timedelta

import pytest

from mlrelease.freshness import assess, parse_budget_hours

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
