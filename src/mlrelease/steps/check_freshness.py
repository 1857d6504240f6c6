"""Step `check-freshness`: every online feature view's newest event must be within its budget of --end."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from mlrelease.errors import GateFailed, StepError
from mlrelease.feast_store import open_store
from mlrelease.freshness import Freshness, assess, parse_budget_hours
from mlrelease.settings import Settings
from mlrelease.timewindow import run_key
from mlrelease.watermarks import WatermarkStore


def write_freshness_metrics(results: list[Freshness], path: Any) -> None:
    """Write freshness gauges in the Prometheus text format (node-exporter textfile / pushgateway body)."""
    registry = CollectorRegistry()
    lag = Gauge(
        "mlrelease_feature_freshness_lag_seconds",
        "Age of the newest materialized event.",
        ["feature_view"],
        registry=registry,
    )
    budget = Gauge(
        "mlrelease_feature_freshness_budget_seconds",
        "Allowed age of the newest event.",
        ["feature_view"],
        registry=registry,
    )
    fresh = Gauge(
        "mlrelease_feature_fresh",
        "1 when the view is within its freshness budget.",
        ["feature_view"],
        registry=registry,
    )
    for item in results:
        lag.labels(item.view).set(item.lag.total_seconds() if item.lag is not None else float("inf"))
        budget.labels(item.view).set(item.budget.total_seconds())
        fresh.labels(item.view).set(1 if item.ok else 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)  # itself writes to a temp file and renames


def check_freshness(settings: Settings, end: datetime) -> dict[str, Any]:
    """Assess every online view at `end`, write the metrics file, fail naming the stale views."""
    store = open_store(settings)
    views = [v for v in store.list_feature_views() if v.online]
    if not views:
        raise StepError("no online feature views are registered: run the apply-features step first")
    try:
        budgets = {v.name: parse_budget_hours(v.name, v.tags) for v in views}
    except ValueError as exc:
        raise StepError(str(exc)) from None
    watermarks = WatermarkStore(settings.home / "state" / "feast_watermarks.json").read()
    results = [assess(name, budget, watermarks.get(name), end) for name, budget in sorted(budgets.items())]

    metrics_path = settings.artifacts_dir / run_key(end) / "freshness.prom"
    write_freshness_metrics(results, metrics_path)
    stale = [r for r in results if not r.ok]
    if stale:
        raise GateFailed(f"stale features at {end.isoformat()}: " + "; ".join(r.describe() for r in stale))
    return {
        "end": end.isoformat(),
        "metrics_file": str(metrics_path),
        "views": {
            r.view: {
                "lag_s": r.lag.total_seconds() if r.lag is not None else None,
                "budget_s": r.budget.total_seconds(),
                "newest_event": r.newest_event.isoformat() if r.newest_event else None,
            }
            for r in results
        },
    }
