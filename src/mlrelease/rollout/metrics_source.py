"""`MetricsSource`: what the guardrails read. One Protocol; one implementation per file; the factory in
`metrics_source_factory.py`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import numpy as np

from mlrelease.rollout.guardrails import CohortWindow
from mlrelease.rollout.outage import CallTimeline


class MetricsSource(Protocol):
    """Per cohort × version traffic statistics over a time window, when calls happened, and the inputs a cohort saw."""

    location: str

    def windows(
        self, since: datetime, until: datetime, exclude: Sequence[tuple[datetime, datetime]] = ()
    ) -> dict[tuple[str, int], CohortWindow]:
        """Per (cohort, *assigned* version), the requests of [since, until) outside the `exclude` stretches, summed per
        user; cohort "*" is all of them. A request belongs to the version its user was assigned to, whoever answered."""

    def timeline(self, since: datetime, until: datetime, stable: int) -> CallTimeline:
        """Per second of [since, until): model calls, requests assigned to `stable`, and how many of those failed."""

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """The encoded feature rows of the cohort's model calls in [since, until) (rows × features)."""
