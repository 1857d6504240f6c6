"""The candidate's MLflow training run: find it, read its metrics, attach the report folder to it.

MLflow is a second home for the report, not its source: every call here turns an MLflow failure into
an `error` string for the caller instead of raising, so a tracking-server outage never loses the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrelease.registry import Registry
from mlrelease.report.model import MlflowRef
from mlrelease.settings import Settings

ARTIFACT_PATH = "release_report"
CHAMPION_PREFIX = "champion_"


@dataclass(frozen=True)
class TrainingRun:
    """Where the training run is, and its holdout metrics (as the train step logged them)."""

    ref: MlflowRef
    metrics: dict[str, Any] = field(default_factory=dict)


def _ui_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    if not tracking_uri.startswith(("http://", "https://")):
        return None  # a local store has no UI address of its own
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def find_training_run(settings: Settings, train_result: dict[str, Any]) -> TrainingRun:
    """The run that trained the candidate: train's `run_id`, else the registry version's run (a rerun of train)."""
    run_id, version = train_result.get("run_id"), train_result.get("model_version")
    if run_id is None and version is None:
        return TrainingRun(MlflowRef(error="this DAG run registered no model version"))
    registry = Registry.from_settings(settings)
    try:
        run_id = run_id or registry.run_id(int(version))  # type: ignore[arg-type]
        run = registry.client().get_run(run_id)
    except Exception as exc:  # any MLflow/network/database failure: report it, keep going
        return TrainingRun(MlflowRef(run_id=run_id, tracking_uri=registry.tracking_uri, error=_one_line(exc)))
    logged = dict(run.data.metrics)
    metrics = {
        "run_id": run_id,
        "metrics": {k: v for k, v in logged.items() if not k.startswith(CHAMPION_PREFIX) and not k.startswith("perf_")},
        "champion_metrics": {
            k.removeprefix(CHAMPION_PREFIX): v for k, v in logged.items() if k.startswith(CHAMPION_PREFIX)
        }
        or None,
        "decision": run.data.tags.get("decision_reason", ""),
    }
    ref = MlflowRef(
        run_id=run_id,
        tracking_uri=registry.tracking_uri,
        ui_url=_ui_url(registry.tracking_uri, run.info.experiment_id, run_id),
    )
    return TrainingRun(ref, metrics)


def log_report(settings: Settings, run_id: str, folder: Path) -> tuple[str | None, str]:
    """Upload `folder` as the run's `release_report/` artifacts; returns (artifact URI, error or "")."""
    registry = Registry.from_settings(settings)
    try:
        client = registry.client()
        client.log_artifacts(run_id, str(folder), ARTIFACT_PATH)
        return f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{ARTIFACT_PATH}", ""
    except Exception as exc:  # see the module docstring
        return None, _one_line(exc)


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
