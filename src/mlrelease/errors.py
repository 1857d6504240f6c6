"""The one exception type a step raises to fail with a clear, single-line message."""


class StepError(Exception):
    """A step failed for a reason the user can act on; the message names the problem."""
