"""Run a step's pod spec as a local process: same command, args and env, same XCom JSON contract."""

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

from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import run_key
from mlrelease_airflow.pod_spec import StepPod
from mlrelease_airflow.ticks import defer_until_next_check

EXIT_GATE_FAILED = 3  # mlrelease.cli: a gate decided against the data or the model
EXIT_SKIPPED = 4  # mlrelease.cli: nothing to do (first release, a paused rollout): skip this task and downstream


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
        self.env_vars: dict[str, str] = dict(pod.env)

    def execute(self, context: Any) -> Any:
        """Run the step; fail with its one-line error; return (and record) its JSON result."""
        try:
            result = self._run(context)
        except AirflowSkipException as exc:
            self._record(context, {"status": "skipped", "reason": str(exc)})
            raise
        except AirflowException as exc:
            self._record(context, {"status": "failed", "error": str(exc)})
            raise
        self._record(context, {"status": "success", "result": result})
        defer_until_next_check(self, result)
        return result

    def execute_again(self, context: Any, event: Any = None) -> Any:
        """Resume after a deferral: run the (tick) step again."""
        return self.execute(context)

    def _run(self, context: Any) -> Any:
        cmds = self.pod.cmds
        argv = [resolve_entrypoint(cmds[0]), *cmds[1:], *[str(a) for a in self.arguments]]
        with tempfile.TemporaryDirectory(prefix="mlrelease-xcom-") as tmp:
            xcom_path = Path(tmp) / "return.json"
            env = {**os.environ, **self.env_vars, "MLRELEASE_XCOM_PATH": str(xcom_path)}
            self.log.info("running %s", " ".join(argv))
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.stdout:
                self.log.info("%s", proc.stdout.rstrip())
            if proc.returncode != 0:
                if proc.stderr:
                    self.log.error("%s", proc.stderr.rstrip())
                error = _error_line(proc.stderr) or f"step {self.pod.step} exited {proc.returncode}"
                if proc.returncode == EXIT_SKIPPED:
                    raise AirflowSkipException(error)
                # A gate's verdict (exit 3) would be the same on every try: fail without retrying.
                raise (AirflowFailException if proc.returncode == EXIT_GATE_FAILED else AirflowException)(error)
            if proc.stderr:
                self.log.info("%s", proc.stderr.rstrip())
            try:
                return json.loads(xcom_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise AirflowException(f"step {self.pod.step} succeeded but its result is unreadable: {exc}") from None

    def _record(self, context: Any, outcome: dict[str, Any]) -> None:
        """Keep the step outcome under the run's artifact folder, for `mlrelease summary`."""
        end = context.get("data_interval_end")
        if end is None:
            return
        path = Settings.from_env().artifacts_dir / run_key(end) / "steps" / f"{self.task_id}.json"
        run_id = context.get("run_id")
        write_json_atomic(path, {"task_id": self.task_id, "step": self.pod.step, "run_id": run_id, **outcome})


def _error_line(stderr: str) -> str:
    """The step's own error line (`mlrelease step X: error: …`), else the last line of stderr."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if ": error: " in line or ": skipped: " in line:
            return line.strip()
    return lines[-1].strip() if lines else ""
