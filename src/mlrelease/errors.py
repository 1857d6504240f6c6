"""The exception types a step raises to fail with a clear, single-line message."""


class StepError(Exception):
    """A step failed for a reason the user can act on; the message names the problem (exit code 2).

    Retrying may help: a server was unreachable, a file was missing, an upstream step has not run.
    """


class GateFailed(StepError):
    """A gate decided against the data or the model (exit code 3): a retry would reach the same verdict."""


class Skipped(Exception):
    """Nothing for this step to do, and that is not a failure (exit code 4: the task ends as skipped).

    E.g. the candidate already is champion (bootstrap), or the rollout is paused for a human.
    """
