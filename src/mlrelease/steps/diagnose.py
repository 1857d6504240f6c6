"""Step `diagnose`: which input features shifted most between a cohort's recent traffic and its training data.

Recent traffic is what the gateway's decision log recorded for the cohort (encoded rows); the reference is
the cohort's orders in the days before the run's data interval end, encoded the same way. Features are
ranked by the two-sample KS statistic; the report names the top ones with their means on both sides.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
from scipy.stats import ks_2samp

from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import run_key

MIN_ROWS = 30
REFERENCE_DAYS = 7


def reference_rows(settings: Settings, cohort: str, data_end: datetime) -> np.ndarray:
    """The cohort's orders in the REFERENCE_DAYS before `data_end`, encoded as the model sees them."""
    from mlrelease.gateway.traffic import order_pool
    from mlrelease.model.features import FEATURES, encode
    from mlrelease.release_spec import process_spec

    pool = order_pool(settings.offline_dir, data_end, process_spec().cohorts, hours=24 * REFERENCE_DAYS)
    return np.asarray(encode(pool.loc[pool["cohort"] == cohort, list(FEATURES)]), dtype=np.float64)


def shifts(recent: np.ndarray, reference: np.ndarray, top: int = 5) -> list[dict[str, Any]]:
    """Features ranked by KS statistic between recent and reference rows (largest shift first)."""
    from mlrelease.model.features import FEATURES

    ranked: list[dict[str, Any]] = []
    for i, name in enumerate(FEATURES):
        test = ks_2samp(recent[:, i], reference[:, i])
        ranked.append(
            {
                "feature": name,
                "ks": round(float(test.statistic), 4),
                "p_value": float(test.pvalue),
                "recent_mean": round(float(recent[:, i].mean()), 4),
                "training_mean": round(float(reference[:, i].mean()), 4),
            }
        )
    return sorted(ranked, key=lambda r: -float(r["ks"]))[:top]


def diagnose(
    settings: Settings,
    cohort: str,
    *,
    since: datetime,
    until: datetime,
    data_end: datetime,
    source: MetricsSource | None = None,
) -> dict[str, Any]:
    """Rank the cohort's features by shift since `since`; the report is also written under the run's artifacts."""
    if source is None:
        from mlrelease.rollout.metrics_source_factory import open_metrics_source

        source = open_metrics_source(settings)
    recent = source.features(cohort, since, until)
    reference = reference_rows(settings, cohort, data_end)
    report: dict[str, Any] = {"cohort": cohort, "recent_rows": len(recent), "training_rows": len(reference)}
    if len(recent) < MIN_ROWS or len(reference) < MIN_ROWS:
        report["status"] = f"not enough rows to compare (need {MIN_ROWS} on each side)"
    else:
        report["status"] = "ok"
        report["top_shifts"] = shifts(recent, reference)
    path = settings.artifacts_dir / run_key(data_end) / "rollout" / f"diagnose-{cohort}.json"
    write_json_atomic(path, report)
    return {**report, "report": str(path)}


def diagnose_recent(settings: Settings, cohort: str, *, hours: float, data_end: datetime) -> dict[str, Any]:
    """`mlrelease step diagnose`: the cohort's last `hours` of traffic against its training data."""
    until = datetime.now().astimezone()
    return diagnose(settings, cohort, since=until - timedelta(hours=hours), until=until, data_end=data_end)
