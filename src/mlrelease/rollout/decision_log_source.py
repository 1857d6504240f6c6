"""The built-in MetricsSource: the gateway replicas' decision logs (every model call, with its answer)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.gateway.decision_log import DecisionReader
from mlrelease.model.estimator import LOW_CONFIDENCE
from mlrelease.model.features import FEATURES
from mlrelease.rollout.guardrails import CohortWindow
from mlrelease.rollout.outage import CallTimeline

HARD_ERRORS = ("error", "timeout", "out_of_range")
SERVING_FAILURES = ("error", "timeout")  # the call itself failed (not the answer): serving, not the model
ALL_COHORTS = "*"


def summarize(records: list[dict[str, Any]]) -> CohortWindow:
    """One CohortWindow from the decision records of one cohort × version."""
    outcomes = [r["outcome"] for r in records]
    answered = [r for r in records if r["outcome"] == "ok"]
    return CohortWindow(
        requests=len(records),
        errors=sum(o in HARD_ERRORS for o in outcomes),
        nan=outcomes.count("nan"),
        low_confidence=sum(r["confidence"] < LOW_CONFIDENCE for r in answered),
        latencies_s=tuple(r["latency_s"] for r in records),
        predictions=tuple(r["eta"] for r in answered),
        confidences=tuple(r["confidence"] for r in answered),
        keys=tuple(r["key"] for r in answered) if all("key" in r for r in answered) else (),
    )


class DecisionLogSource:
    """Reads `<directory>/*.jsonl` written by every gateway replica.

    :param directory: the gateway's decision-log directory.
    """

    def __init__(self, directory: Path) -> None:
        self.location = str(directory)
        self._reader = DecisionReader(directory)

    def windows(self, since: datetime, until: datetime) -> dict[tuple[str, int], CohortWindow]:
        """Each (cohort, version) with model calls in [since, until), summarised; cohort "*" is every cohort."""
        groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for record in self._reader.read(since, until):
            groups[(record["cohort"], int(record["version"]))].append(record)
            groups[(ALL_COHORTS, int(record["version"]))].append(record)
        return {key: summarize(records) for key, records in groups.items()}

    def timeline(self, since: datetime, until: datetime) -> CallTimeline:
        """When calls happened in [since, until), and stable's failed calls (the decision log keeps every failure)."""
        records = self._reader.read(since, until)
        return CallTimeline(
            calls=tuple(r["t"] for r in records),
            stable_failures=tuple(
                r["t"] for r in records if r.get("role") == "stable" and r["outcome"] in SERVING_FAILURES
            ),
        )

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """Encoded rows the cohort's calls carried (records written without features are skipped)."""
        rows = [
            r["features"]
            for r in self._reader.read(since, until)
            if r["cohort"] == cohort and len(r.get("features") or ()) == len(FEATURES)
        ]
        return np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES))
