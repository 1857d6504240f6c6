"""The fast guard: a per-version circuit breaker on hard failures (errors, timeouts, NaN/inf, out-of-range)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlrelease.release_spec import ReleaseSpec


class BreakerState(IntEnum):
    """Breaker states; the value is what the `breaker_state` gauge exports."""

    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class CircuitBreaker:
    """Opens after `failures_to_trip` hard failures within `window_s`; after `open_for_s` it lets traffic probe.

    :param failures_to_trip: failures inside the window that open the breaker.
    :param window_s: sliding window for counting failures.
    :param open_for_s: rest period before a half-open probe.
    :param clock: monotonic clock (injectable for tests).
    """

    def __init__(
        self,
        failures_to_trip: int,
        window_s: float,
        open_for_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_to_trip = failures_to_trip
        self.window_s = window_s
        self.open_for_s = open_for_s
        self._clock = clock
        self._failures: deque[float] = deque()
        self._opened_at: float | None = None
        self.state = BreakerState.CLOSED

    def allow(self) -> bool:
        """Whether a request may go to this version now (an open breaker turns half-open after its rest)."""
        if self.state is BreakerState.OPEN:
            assert self._opened_at is not None
            if self._clock() - self._opened_at < self.open_for_s:
                return False
            self.state = BreakerState.HALF_OPEN
        return True

    def record_success(self) -> None:
        """A good answer: a half-open breaker closes."""
        if self.state is BreakerState.HALF_OPEN:
            self.state = BreakerState.CLOSED
            self._failures.clear()

    def record_failure(self) -> bool:
        """A hard failure; returns True when this failure opened the breaker."""
        now = self._clock()
        if self.state is BreakerState.HALF_OPEN:
            return self._open(now)
        if self.state is BreakerState.OPEN:
            return False
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.window_s:
            self._failures.popleft()
        return self._open(now) if len(self._failures) >= self.failures_to_trip else False

    def reset(self) -> None:
        """Back to closed with no failures counted."""
        self.state = BreakerState.CLOSED
        self._failures.clear()
        self._opened_at = None

    def _open(self, now: float) -> bool:
        self.state = BreakerState.OPEN
        self._opened_at = now
        self._failures.clear()
        return True


# The valid [low, high] of the prediction and of the score, from the release spec's outputs (`Output.valid`).
OutputRanges = tuple[tuple[float, float], tuple[float, float]]


def output_ranges(spec: ReleaseSpec) -> OutputRanges:
    """The valid prediction and score of a served model, as its release spec declares them."""
    prediction, score = spec.prediction_and_score()
    by_name = {o.name: o for o in spec.outputs}
    return by_name[prediction].valid, by_name[score].valid


def output_problem(prediction: float, score: float, ranges: OutputRanges) -> str | None:
    """Why a model answer is unusable (`nan` or `out_of_range`), or None when it is fine."""
    if not (math.isfinite(prediction) and math.isfinite(score)):
        return "nan"
    (low, high), (score_low, score_high) = ranges
    if not (low <= prediction <= high and score_low <= score <= score_high):
        return "out_of_range"
    return None
