"""`MetricsSource`: what the guardrails read. One Protocol; one implementation per file; the factory in
`metrics_source_factory.py`."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import numpy as np

from mlrelease.rollout.guardrails import CohortWindow
from mlrelease.rollout.outage import CallTimeline


class MetricsSource(Protocol):
    """Per cohort × version traffic statistics over a time window, when calls happened, and the inputs a cohort saw."""

    location: str

    def windows(self, since: datetime, until: datetime) -> dict[tuple[str, int], CohortWindow]:
        """Each (cohort, version) that served model calls in [since, until), summarised; cohort "*" is all of them."""

    def timeline(self, since: datetime, until: datetime) -> CallTimeline:
        """When model calls happened in [since, until), and when stable's calls failed (errors, timeouts)."""

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """The encoded feature rows of the cohort's model calls in [since, until) (rows × features)."""
