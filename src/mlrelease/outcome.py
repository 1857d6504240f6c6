"""Step outcomes, recorded by the `mlrelease step` command itself where it runs.

Each step process leaves `<artifacts>/<run key>/steps/<task id>.json` (status success, failed or skipped, with the
result, the error line or the reason), next to its XCom result. The summary, the release report and the alerts
read these files, so they say the same thing whichever runner (a local process or a Kubernetes pod) ran the step.

The runner tells the step which task instance it is through the environment (`StepRun.ENV`, rendered by Airflow
per task try); a step run by hand, outside a DAG run, records nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import parse_timestamp, run_key

TASK_ID_ENV = "MLRELEASE_TASK_ID"
RUN_ID_ENV = "MLRELEASE_RUN_ID"
TRY_NUMBER_ENV = "MLRELEASE_TRY_NUMBER"
INTERVAL_END_ENV = "MLRELEASE_DATA_INTERVAL_END"  # keys the run's artifact folder (empty: a run without interval)
RECORDED_BY_STEP, RECORDED_BY_RUNNER = "step", "runner"


def steps_dir(settings: Settings, key: str) -> Path:
    """The folder holding run `key`'s step outcomes, one JSON file per task."""
    return settings.artifacts_dir / key / "steps"


def read_outcome(path: Path) -> dict[str, Any] | None:
    """The outcome recorded at `path`; None when there is none (or it is unreadable: the caller may replace it)."""
    try:
        outcome = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return outcome if isinstance(outcome, dict) else None


@dataclass(frozen=True)
class StepRun:
    """Which task instance a step process is, as its runner declared it in the environment.

    :param task_id: the Airflow task id (one step may run as several tasks, e.g. `analyze_1`, `analyze_2`).
    :param run_id: the DAG run's id; the summary keeps only the latest run's outcomes of an interval.
    :param key: the run key (folder under the artifacts dir) of the run's data interval end.
    :param try_number: the task try, so a runner can tell this try's record from an earlier one.
    """

    task_id: str
    run_id: str
    key: str
    try_number: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StepRun | None:
        """The task instance named by the MLRELEASE_TASK_ID/RUN_ID/TRY_NUMBER/DATA_INTERVAL_END variables.

        None when the task id or the interval end is missing or empty: a step run by hand, or a DAG run
        without a data interval (nowhere to key the record). A malformed interval end is a ValueError.
        """
        env = os.environ if environ is None else environ
        task_id = env.get(TASK_ID_ENV, "").strip()
        end = env.get(INTERVAL_END_ENV, "").strip()
        if not task_id or not end:
            return None
        try_text = env.get(TRY_NUMBER_ENV, "").strip()
        return cls(
            task_id=task_id,
            run_id=env.get(RUN_ID_ENV, "").strip(),
            key=run_key(parse_timestamp(end, name=INTERVAL_END_ENV)),
            try_number=int(try_text) if try_text.isdigit() else None,
        )

    def path(self, settings: Settings) -> Path:
        """Where this task's outcome is recorded."""
        return steps_dir(settings, self.key) / f"{self.task_id}.json"

    def record(
        self, settings: Settings, step: str, outcome: Mapping[str, Any], *, exit_code: int, by: str = RECORDED_BY_STEP
    ) -> Path:
        """Write this try's outcome (`outcome` holds status and result, error or reason) atomically; return the path.

        :param by: `step` when the step process records itself, `runner` when its runner records what the step
            could not (it never started, or was killed).
        """
        path = self.path(settings)
        write_json_atomic(
            path,
            {
                "task_id": self.task_id,
                "step": step,
                "run_id": self.run_id,
                "try_number": self.try_number,
                "exit_code": exit_code,
                "recorded_by": by,
                **outcome,
            },
        )
        return path

    def recorded(self, settings: Settings) -> dict[str, Any] | None:
        """The outcome this very try recorded (same run and try), None when it left none."""
        outcome = read_outcome(self.path(settings))
        if outcome is None or outcome.get("run_id") != self.run_id or outcome.get("try_number") != self.try_number:
            return None
        return outcome
