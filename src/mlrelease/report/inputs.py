"""Reading what a run left behind (step outcomes, JSON artifacts, metrics files, the rollout record).

Missing files are normal (a run that stopped early) and read as None; a file that exists but cannot be
parsed is a `ReportInputError` naming it, so a broken artifact is never silently shown as "not reached".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlrelease.errors import StepError
from mlrelease.exit_codes import STATUSES
from mlrelease.outcome import steps_dir
from mlrelease.registry import MODEL_NAME
from mlrelease.rollout.store import RolloutRecord, RolloutStore
from mlrelease.settings import Settings
from mlrelease.summary import load_outcomes
from mlrelease.timewindow import parse_run_key
from mlrelease.yamlconfig import validation_problems


class ReportInputError(StepError):
    """A file the report reads exists but is corrupt; the message names the file."""


def read_json(path: Path) -> Any:
    """The parsed JSON at `path`, None when the file does not exist; corrupt JSON names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ReportInputError(f"{path} is not valid JSON: {exc}") from None


def run_outcomes(settings: Settings, key: str) -> dict[str, dict[str, Any]]:
    """The step outcomes of the latest DAG run of interval `key` (the summary's reader), by task id.

    Each step records its own outcome where it runs (`mlrelease.outcome`), so this reads the same on either runner.
    """
    try:
        outcomes = load_outcomes(settings, parse_run_key(key))
    except ValueError:
        # load_outcomes does not say which file broke: find it, so the error names it.
        for path in sorted(steps_dir(settings, key).glob("*.json")):
            read_json(path)
        raise
    for task, outcome in outcomes.items():
        if not isinstance(outcome, dict) or outcome.get("status") not in STATUSES:
            path = steps_dir(settings, key) / f"{task}.json"
            raise ReportInputError(f"{path} is not a step outcome (no status success/failed/skipped)")
    return outcomes


def rollout_record(settings: Settings, key: str) -> RolloutRecord | None:
    """The rollout record owned by run `key`: the current one if it is this run's, else the archived one."""
    store = RolloutStore.from_settings(settings, MODEL_NAME)
    current = store.read()
    if current is not None and current.run_key == key:
        return current
    found = []
    for path in store.archived_paths(key):
        try:
            found.append(RolloutRecord.model_validate_json(path.read_bytes()))
        except ValidationError as exc:
            raise ReportInputError(f"rollout record {path} is invalid: {validation_problems(exc)}") from None
    # A rerun of the interval with a new candidate archives another record: the latest one is this run's.
    return max(found, key=lambda r: r.started_at, default=None)


def freshness_metrics(path: Path) -> dict[str, dict[str, float]] | None:
    """Lag and budget seconds per feature view from the check-freshness textfile; None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    names = {
        "mlrelease_feature_freshness_lag_seconds": "lag_s",
        "mlrelease_feature_freshness_budget_seconds": "budget_s",
    }
    views: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names and "feature_view" in sample.labels:
                    views.setdefault(sample.labels["feature_view"], {})[names[sample.name]] = float(sample.value)
    except ValueError as exc:
        raise ReportInputError(f"{path} is not a Prometheus text file: {exc}") from None
    incomplete = sorted(v for v, d in views.items() if set(d) != set(names.values()))
    if incomplete:
        raise ReportInputError(f"{path} lacks the lag or the budget of {', '.join(incomplete)}")
    return views
