"""Run a step's pod spec as a local process: same command, args and env, same XCom JSON contract.

The step records its own outcome (mlrelease.outcome), as it does in a pod; this runner records one only for a try
the step could not record: it never reached its main (no entrypoint, a usage error) or was killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from mlrelease.exit_codes import EXIT_NOT_STARTED, EXIT_OK, EXIT_SKIPPED, STATUS_FAILED, retryable
from mlrelease.outcome import RECORDED_BY_RUNNER, StepRun
from mlrelease.release_spec import MODEL_ENV
from mlrelease.settings import Settings
from mlrelease_airflow.pod_spec import StepPod
from mlrelease_airflow.ticks import defer_until_next_check


def resolve_entrypoint(command: str) -> str:
    """Find the step CLI: next to the running interpreter first (the venv Airflow runs from), then PATH."""
    beside = Path(sys.executable).parent / command
    if beside.is_file():
        return str(beside)
    found = shutil.which(command)
    if found is None:
        raise AirflowException(f"step command {command!r} not found next to {sys.executable} or on PATH")
    return found


class LocalStepOperator(BaseOperator):
    """Execute `mlrelease step <name> …` as a subprocess and push the JSON it writes to the XCom path.

    :param pod: the step's pod spec; its command, templated args and env are used as they would be in a pod.
    """

    template_fields: Sequence[str] = ("arguments", "env_vars")
    ui_color = "#e8f4fa"

    def __init__(self, *, pod: StepPod, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pod = pod
        self.arguments: list[str] = list(pod.args)
        self.env_vars: dict[str, str] = pod.env_vars  # with the task's identity: the step records its outcome

    def execute(self, context: Any) -> Any:
        """Run the step; fail with its one-line error; return its JSON result."""
        result = self._run()
        defer_until_next_check(self, result)
        return result

    def execute_again(self, context: Any, event: Any = None) -> Any:
        """Resume after a deferral: run the (tick) step again."""
        return self.execute(context)

    def _run(self) -> Any:
        cmds = self.pod.cmds
        with tempfile.TemporaryDirectory(prefix="mlrelease-xcom-") as tmp:
            xcom_path = Path(tmp) / "return.json"
            env = {**os.environ, **self.env_vars, "MLRELEASE_XCOM_PATH": str(xcom_path)}
            try:
                argv = [resolve_entrypoint(cmds[0]), *cmds[1:], *[str(a) for a in self.arguments]]
            except AirflowException as exc:
                self._record_failure(EXIT_NOT_STARTED, str(exc))
                raise
            self.log.info("running %s", " ".join(argv))
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.stdout:
                self.log.info("%s", proc.stdout.rstrip())
            if proc.returncode != EXIT_OK:
                if proc.stderr:
                    self.log.error("%s", proc.stderr.rstrip())
                error = _error_line(proc.stderr) or f"step {self.pod.step} exited {proc.returncode}"
                if proc.returncode == EXIT_SKIPPED:
                    raise AirflowSkipException(error)
                self._record_failure(proc.returncode, error)
                # A gate's verdict (exit 3) would be the same on every try: fail without retrying.
                raise (AirflowException if retryable(proc.returncode) else AirflowFailException)(error)
            if proc.stderr:
                self.log.info("%s", proc.stderr.rstrip())
            try:
                return json.loads(xcom_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                error = f"step {self.pod.step} succeeded but its result is unreadable: {exc}"
                self._record_failure(proc.returncode, error, over_the_steps=True)
                raise AirflowException(error) from None

    def _record_failure(self, code: int, error: str, *, over_the_steps: bool = False) -> None:
        """Record a failed try that the step left no record of (it never reached its main, or was killed).

        The step is the one writer of its outcome; the runner adds one only where the step could not, or, with
        `over_the_steps`, where the task fails although the step recorded a success (its result was unreadable).
        """
        try:
            step_run = StepRun.from_env(self.env_vars)  # the identity the step was given
            if step_run is None:
                return
            settings = Settings.from_env().for_model(self.env_vars[MODEL_ENV])  # the step's model, not the worker's
            if not over_the_steps and step_run.recorded(settings) is not None:
                return
            outcome = {"status": STATUS_FAILED, "error": error}
            step_run.record(settings, self.pod.step, outcome, exit_code=code, by=RECORDED_BY_RUNNER)
        except (OSError, ValueError) as exc:
            self.log.warning("outcome of %s not recorded: %s", self.task_id, exc)


def _error_line(stderr: str) -> str:
    """The step's own error line (`mlrelease step X: error: …`), else the last line of stderr."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if ": error: " in line or ": skipped: " in line:
            return line.strip()
    return lines[-1].strip() if lines else ""
