"""The exit codes of `mlrelease` commands: the contract between a step and the runner that started it.

Both runners (plugins/mlrelease_airflow: the local process runner and the KubernetesPodOperator) import these,
so a code means the same thing wherever the step ran.
"""

from __future__ import annotations

EXIT_OK = 0  # the step did its work; its JSON result is at the XCom path
EXIT_CRASH = 1  # an unexpected exception (a bug): Python's own status for an uncaught exception; retried
EXIT_STEP_ERROR = 2  # something to fix or retry (argparse's usage errors exit 2 as well)
EXIT_GATE_FAILED = 3  # a gate's verdict: retrying the same inputs gives the same answer, so the task fails for good
EXIT_SKIPPED = 4  # nothing to do (bootstrap, a paused rollout): the task ends as skipped, downstream too
# Not returned by a step: what a runner records when it could not start one (the shell's "command not found").
EXIT_NOT_STARTED = 127

STATUS_SUCCESS, STATUS_FAILED, STATUS_SKIPPED = "success", "failed", "skipped"
STATUSES = (STATUS_SUCCESS, STATUS_FAILED, STATUS_SKIPPED)


def status_of(code: int) -> str:
    """The task outcome an exit code leads to: success, skipped, or failed (every other code)."""
    return {EXIT_OK: STATUS_SUCCESS, EXIT_SKIPPED: STATUS_SKIPPED}.get(code, STATUS_FAILED)


def retryable(code: int) -> bool:
    """Whether a failed step is worth another try: not after a gate's verdict (nor after success or a skip)."""
    return status_of(code) == STATUS_FAILED and code != EXIT_GATE_FAILED
