"""Step `report`: the run's release report (one HTML page with its PNGs), written atomically, copied to MLflow.

The page is built from the artifacts the run left (step outcomes, data-quality and shadow JSON, the
rollout record, the gateway's decision log), so it also renders for a run that stopped early: sections
that were not reached say so. It replaces the previous report of the same interval as a whole.

MLflow is a copy, not the source of truth: when the tracking server cannot be reached, the report is
still written, the result carries `mlflow_error`, and the step succeeds. A release that was decided
correctly must not turn red because its paperwork could not be uploaded; the error is in the result,
the task log, and on the page's MLflow line.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from mlrelease.report.collect import collect
from mlrelease.report.inputs import run_outcomes
from mlrelease.report.links import report_dir, report_url
from mlrelease.report.model import MlflowRef
from mlrelease.report.page import write_page
from mlrelease.report.publish import replace_dir
from mlrelease.settings import Settings
from mlrelease.timewindow import run_key

log = logging.getLogger(__name__)


def build_report(
    settings: Settings, window_end: datetime, *, log_to_mlflow: bool = True, base_url: str | None = None
) -> dict[str, Any]:
    """Build run `window_end`'s report into `report_dir`, replacing the old one, and attach it to the MLflow run.

    :param window_end: the DAG run's data interval end (names the run: `run_key(window_end)`).
    :param log_to_mlflow: look up the candidate's training run and upload the folder as `release_report/`.
    :param base_url: where reports are served (see `report_url`); default MLRELEASE_REPORT_BASE_URL.
    :raises ReportInputError: an artifact of the run exists but is corrupt (the message names the file).
    """
    key = run_key(window_end)
    training = None
    if log_to_mlflow:
        from mlrelease.report.mlflow_run import find_training_run

        train = run_outcomes(settings, key).get("train", {})
        training = find_training_run(settings, train.get("result") or {})
    ref = training.ref if training else MlflowRef(error="not looked up")
    report = collect(settings, key, mlflow=ref, mlflow_metrics=training.metrics if training else None)
    target = report_dir(settings, key)
    files: list[str] = []

    def build(folder: Path) -> None:
        files.extend(write_page(report, folder))

    replace_dir(target, build)
    result: dict[str, Any] = {
        "report": str(target),
        "url": report_url(settings, key, base_url),
        "verdict": report.verdict.headline,
        "sections": [{"name": name, "state": str(s.state)} for name, s in report.sections().items()],
        "files": files,
        "mlflow_artifact_uri": None,
    }
    if log_to_mlflow and ref.run_id and not ref.error:
        from mlrelease.report.mlflow_run import log_report

        uri, error = log_report(settings, ref.run_id, target)
        result["mlflow_artifact_uri"] = uri
        if error:
            result["mlflow_error"] = error
    elif log_to_mlflow:
        result["mlflow_error"] = ref.error or "no MLflow training run known for this DAG run"
    if "mlflow_error" in result:
        log.warning("release report written to %s but not logged to MLflow: %s", target, result["mlflow_error"])
    return result
