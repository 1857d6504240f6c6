"""`MetricsSource`: what the guardrails read. One Protocol; one implementation per file; a factory."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Protocol

import numpy as np

from mlrelease.errors import StepError
from mlrelease.rollout.guardrails import CohortWindow
from mlrelease.rollout.outage import CallTimeline
from mlrelease.settings import Settings


class MetricsSource(Protocol):
    """Per cohort × version traffic statistics over a time window, when calls happened, and the inputs a cohort saw."""

    location: str

    def windows(self, since: datetime, until: datetime) -> dict[tuple[str, int], CohortWindow]:
        """Each (cohort, version) that served model calls in [since, until), summarised; cohort "*" is all of them."""

    def timeline(self, since: datetime, until: datetime) -> CallTimeline:
        """When model calls happened in [since, until), and when stable's calls failed (errors, timeouts)."""

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """The encoded feature rows of the cohort's model calls in [since, until) (rows × features)."""


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

        return DecisionLogSource(load_config().decision_dir(settings))
    raise StepError(f"MLRELEASE_METRICS_SOURCE must be one of {', '.join(SOURCES)}; got {kind!r}")
