"""The factory of `MetricsSource` (rollout/metrics_source.py): the source MLRELEASE_METRICS_SOURCE names."""

from __future__ import annotations

import os

from mlrelease.errors import StepError
from mlrelease.rollout.metrics_source import MetricsSource
from mlrelease.settings import Settings

SOURCES = ("decision_log",)


def metrics_source_kind() -> str:
    """The source MLRELEASE_METRICS_SOURCE names (default `decision_log`)."""
    return os.environ.get("MLRELEASE_METRICS_SOURCE", "decision_log")


def open_metrics_source(settings: Settings) -> MetricsSource:
    """The source named by MLRELEASE_METRICS_SOURCE (default `decision_log`: the gateway's decision log)."""
    kind = metrics_source_kind()
    if kind == "decision_log":
        from mlrelease.gateway.config import load_config
        from mlrelease.rollout.decision_log_source import DecisionLogSource

        return DecisionLogSource(load_config().decision_dir(settings, settings.release_model))
    raise StepError(f"MLRELEASE_METRICS_SOURCE must be one of {', '.join(SOURCES)}; got {kind!r}")
