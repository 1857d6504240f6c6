"""Step `check-freshness`: every online feature view's newest event must be within its budget of --end.

Besides the gate, the step exports its findings for Prometheus: a textfile under the run's artifacts (node
exporter textfile collector) and, when MLRELEASE_PUSHGATEWAY_URL is set, the same registry pushed to a
Pushgateway — the standard route for batch jobs, which are gone before any scrape could reach them.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, write_to_textfile

from mlrelease.errors import GateFailed, StepError
from mlrelease.feast_store import open_store
from mlrelease.freshness import Freshness, assess, parse_budget_hours
from mlrelease.registry import MODEL_NAME
from mlrelease.settings import Settings
from mlrelease.timewindow import run_key
from mlrelease.watermarks import WatermarkStore

log = logging.getLogger(__name__)

PUSHGATEWAY_ENV = "MLRELEASE_PUSHGATEWAY_URL"
PUSH_JOB = "mlrelease_freshness"
PUSH_TIMEOUT_S = 10.0


def freshness_registry(results: list[Freshness], checked_at: float) -> CollectorRegistry:
    """The freshness metrics of one check in their own registry (what the textfile holds and the push sends).

    The lag gauge is the lag at `--end`, frozen until the next run; alerts need timestamps that Prometheus
    can age with `time()`: the newest event per view and when the check itself ran (unix seconds).
    """
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
    last_event = Gauge(
        "mlrelease_feature_last_event_timestamp_seconds",
        "Event time of the newest materialized row (unix seconds; 0 when never materialized).",
        ["feature_view"],
        registry=registry,
    )
    checked = Gauge(
        "mlrelease_feature_freshness_check_timestamp_seconds",
        "When the freshness check last ran (unix seconds).",
        registry=registry,
    )
    for item in results:
        lag.labels(item.view).set(item.lag.total_seconds() if item.lag is not None else float("inf"))
        budget.labels(item.view).set(item.budget.total_seconds())
        fresh.labels(item.view).set(1 if item.ok else 0)
        # 0 (the epoch) for a view never materialized: `time() - ts > budget` then holds, so the alert fires.
        last_event.labels(item.view).set(item.newest_event.timestamp() if item.newest_event is not None else 0.0)
    checked.set(checked_at)
    return registry


def write_freshness_metrics(results: list[Freshness], path: Any, checked_at: float | None = None) -> CollectorRegistry:
    """Write freshness gauges in the Prometheus text format (node-exporter textfile); returns the registry."""
    registry = freshness_registry(results, time.time() if checked_at is None else checked_at)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)  # itself writes to a temp file and renames
    return registry


def pushgateway_url(raw: str) -> str | None:
    """The settings' MLRELEASE_PUSHGATEWAY_URL when set (validated: an http(s) URL or host:port), else None."""
    raw = raw.strip()
    if not raw:
        return None
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")  # push_to_gateway itself defaults to http
    try:
        host = parts.hostname if parts.port is None or parts.port > 0 else None  # .port raises on "host:abc"
    except ValueError:
        host = None
    if parts.scheme not in ("http", "https") or not host:
        raise StepError(f"{PUSHGATEWAY_ENV} must be an http(s) URL such as http://pushgateway:9091; got {raw!r}")
    return raw


def push_freshness_metrics(registry: CollectorRegistry, url: str, model: str = MODEL_NAME) -> None:
    """PUT the registry to the Pushgateway as job `mlrelease_freshness`, grouped by model (replaces the group)."""
    push_to_gateway(url, job=PUSH_JOB, registry=registry, grouping_key={"model": model}, timeout=PUSH_TIMEOUT_S)


def _push(registry: CollectorRegistry, url: str) -> dict[str, Any]:
    """Push, reporting a failure instead of raising: the gate's verdict must not hinge on the metrics path.

    An unreachable Pushgateway still shows: the `MlreleaseFreshnessCheckNotRun` alert fires when no
    fresh check timestamp arrives.
    """
    try:
        push_freshness_metrics(registry, url)
    except OSError as exc:  # URLError and HTTPError are OSErrors; so are refused connections and timeouts
        log.warning("could not push freshness metrics to %s: %s", url, exc)
        return {"url": url, "pushed": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"url": url, "pushed": True}


def check_freshness(settings: Settings, end: datetime) -> dict[str, Any]:
    """Assess every online view at `end`, write (and push) the metrics, fail naming the stale views."""
    push_url = pushgateway_url(settings.pushgateway_url)  # a malformed URL fails before any work
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
    registry = write_freshness_metrics(results, metrics_path)
    pushed = _push(registry, push_url) if push_url else None  # before the verdict: a stale view must reach alerts
    stale = [r for r in results if not r.ok]
    if stale:
        raise GateFailed(f"stale features at {end.isoformat()}: " + "; ".join(r.describe() for r in stale))
    outcome: dict[str, Any] = {
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
    if pushed is not None:
        outcome["pushgateway"] = pushed
    return outcome
