"""The built-in MetricsSource: the gateway replicas' decision logs (every model call, with its answer)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from mlrelease.gateway.decision_log import DecisionReader
from mlrelease.model.features import FEATURES
from mlrelease.rollout.outage import CallTimeline
from mlrelease.rollout.windows import OUTCOME_CODES, SERVING_FAILURES, CohortWindow, summarize_calls

ALL_COHORTS = "*"


def summarize(records: list[dict[str, Any]]) -> CohortWindow:
    """Per-user sums of one arm's decision records (oldest first); see `mlrelease.rollout.windows`.

    Records written before the log carried `assigned`, `unit` and `w` count as their own arm, one user per record
    and weight 1: what the analysis assumed then.
    """
    return summarize_calls(
        unit=np.array([r.get("unit", i) for i, r in enumerate(records)], dtype=np.int64),
        outcome=np.array([OUTCOME_CODES[r["outcome"]] for r in records], dtype=np.int64),
        latency_s=np.array([r["latency_s"] for r in records], dtype=np.float64),
        weight=np.array([r.get("w", 1.0) for r in records], dtype=np.float64),
        retry=np.array([r.get("retry", False) for r in records], dtype=bool),
        key=np.array([r.get("key", -1 - i) for i, r in enumerate(records)], dtype=np.int64),
        eta=np.array([r.get("eta") if r["outcome"] == "ok" else np.nan for r in records], dtype=np.float64),
        confidence=np.array(
            [r.get("confidence") if r["outcome"] == "ok" else np.nan for r in records], dtype=np.float64
        ),
    )


def _model_call(record: dict[str, Any]) -> bool:
    """False for a stable-assigned request the rule answered while stable's breaker was open (no call was made)."""
    return record["outcome"] != "unavailable"


def _assigned(record: dict[str, Any]) -> int:
    return int(record.get("assigned", record["version"]))


class DecisionLogSource:
    """Reads `<directory>/*.jsonl` written by every gateway replica.

    :param directory: the gateway's decision-log directory.
    """

    def __init__(self, directory: Path) -> None:
        self.location = str(directory)
        self._reader = DecisionReader(directory)

    def windows(
        self, since: datetime, until: datetime, exclude: Sequence[tuple[datetime, datetime]] = ()
    ) -> dict[tuple[str, int], CohortWindow]:
        """Per (cohort, assigned version), the requests of [since, until) outside `exclude`, summed per user."""
        cut = [(a.timestamp(), b.timestamp()) for a, b in exclude]
        groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for record in self._reader.read(since, until):
            if not _model_call(record) or any(a <= record["t"] < b for a, b in cut):
                continue
            arm = _assigned(record)
            groups[(record["cohort"], arm)].append(record)
            groups[(ALL_COHORTS, arm)].append(record)
        return {key: summarize(records) for key, records in groups.items()}

    def timeline(self, since: datetime, until: datetime, stable: int) -> CallTimeline:
        """Per second: every model call, the requests assigned to `stable` and those whose stable call failed (or
        was not made: its breaker was open)."""
        records = self._reader.read(since, until)
        first_calls = [r for r in records if not r.get("retry") and _assigned(r) == stable]
        return CallTimeline.from_times(
            since,
            until,
            calls=[r["t"] for r in records if _model_call(r)],
            stable_requests=[r["t"] for r in first_calls],
            stable_weights=[r.get("w", 1.0) for r in first_calls],
            stable_failures=[r["t"] for r in first_calls if OUTCOME_CODES[r["outcome"]] in SERVING_FAILURES],
        )

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """Encoded rows the cohort's calls carried (records written without features are skipped)."""
        rows = [
            r["features"]
            for r in self._reader.read(since, until)
            if r["cohort"] == cohort and _model_call(r) and len(r.get("features") or ()) == len(FEATURES)
        ]
        return np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES))
