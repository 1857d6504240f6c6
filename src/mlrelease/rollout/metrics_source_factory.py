"""The factory of `MetricsSource` (rollout/metrics_source.py): the source the settings name."""

from __future__ import annotations

from mlrelease.errors import StepError
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.settings import Settings

SOURCES = ("decision_log", "prometheus")


def open_metrics_source(settings: Settings) -> MetricsSource:
    """The source `settings.metrics_source` names (default `decision_log`: the gateway's decision log; `prometheus`:
    the gateway replicas' arm series read with PromQL from MLRELEASE_PROMETHEUS_URL)."""
    kind = settings.metrics_source
    if kind == "decision_log":
        from mlrelease.gateway.config import step_gateway_config
        from mlrelease.rollout.decision_log_source import DecisionLogSource

        return DecisionLogSource(step_gateway_config(settings).decision_dir(settings, settings.release_model))
    if kind == "prometheus":
        from mlrelease.rollout.prometheus_source import PrometheusSource

        if not settings.prometheus_url:
            raise StepError("MLRELEASE_METRICS_SOURCE=prometheus needs MLRELEASE_PROMETHEUS_URL (http://host:9090)")
        return PrometheusSource(settings.prometheus_url, settings.release_model, selector=settings.prometheus_selector)
    raise StepError(f"MLRELEASE_METRICS_SOURCE must be one of {', '.join(SOURCES)}; got {kind!r}")
