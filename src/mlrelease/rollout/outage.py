"""Outages in a stage's window: stretches in which serving itself, not the candidate, was down (pure).

A stage judges the candidate against stable's requests of the same window. When serving was down for a while
(Triton restarted, every gateway process died, stable's own calls failing), both arms were measured through the
fault: that stretch says nothing about the candidate, so it is *cut out* of the judged window (the contracts read
the rest), and only an outage still going on when the analysis looks holds a pass back. Two kinds of evidence:

- `stable_failed`: in one slice of `max_gap_s` seconds, stable-assigned requests failed (errors, timeouts, or no call
  at all: stable's breaker rested it) at a rate far above stable's own: at least `MIN_STABLE_FAILURES` failures and
  a share of the slice's stable requests of at least `max(OUTAGE_SHARE, OUTAGE_FACTOR × stable's rate in the slices
  below OUTAGE_SHARE)`. Relative to stable and to its traffic: a stable that fails 1 in 10,000 calls, in bursts of a
  few, is ordinary production, not an outage, however long the stage.
- `no_calls`: no model call at all (any arm, any cohort) for longer than `max_gap_s`, including a silence at the
  window's end (an outage still going on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

MIN_STABLE_FAILURES = 3  # fewer failures in a slice is a stray slow call, not serving being down
OUTAGE_SHARE = 0.05  # at least this share of a slice's stable requests failed …
OUTAGE_FACTOR = 20.0  # … and at least this many times stable's own failure rate over the window


def _zeros() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class CallTimeline:
    """Per second of a window from `start` (unix seconds): model calls, stable-assigned requests, and how many of
    those failed (errors, timeouts)."""

    start: float = 0.0
    calls: np.ndarray = field(default_factory=_zeros)
    stable_requests: np.ndarray = field(default_factory=_zeros)
    stable_failures: np.ndarray = field(default_factory=_zeros)

    @classmethod
    def from_times(
        cls,
        since: datetime,
        until: datetime,
        calls: Any = (),
        stable_requests: Any = (),
        stable_failures: Any = (),
        stable_weights: Any = None,
    ) -> CallTimeline:
        """Bin moments (unix seconds) into the window's seconds; moments outside [since, until) are dropped.

        `stable_weights` (parallel to `stable_requests`) weigh sampled records by 1 / sample rate.
        """
        start, end = since.timestamp(), until.timestamp()
        seconds = max(int(math.ceil(end - start)), 0)

        def binned(times: Any, weights: Any = None) -> np.ndarray:
            t = np.asarray(times, dtype=np.float64)
            w = np.ones(len(t)) if weights is None else np.asarray(weights, dtype=np.float64)
            inside = (t >= start) & (t < end)
            index = (t[inside] - start).astype(np.int64)
            return np.bincount(index, weights=w[inside], minlength=seconds)[:seconds]

        return cls(start, binned(calls), binned(stable_requests, stable_weights), binned(stable_failures))


@dataclass(frozen=True)
class Outage:
    """One stretch of a window in which serving was down: what showed it, from when, until when."""

    kind: Literal["stable_failed", "no_calls"]
    start: datetime
    end: datetime
    detail: str
    ongoing: bool = False  # it lasts until the end of the window: serving may still be down

    @property
    def duration_s(self) -> float:
        """How long it lasted."""
        return (self.end - self.start).total_seconds()

    def describe(self) -> str:
        """One phrase for reasons, alerts and the report."""
        still = " (still going on)" if self.ongoing else ", cut out of the judged window"
        return f"{self.detail} at {self.start:%H:%M:%S} for {self.duration_s:.0f} s{still}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form for the record, the evidence trail and the step's result."""
        return {
            "kind": self.kind,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "duration_s": round(self.duration_s, 3),
            "detail": self.detail,
            "ongoing": self.ongoing,
        }


def find_outages(timeline: CallTimeline, max_gap_s: float) -> tuple[Outage, ...]:
    """Every outage in the timeline's window, oldest first (see the module docstring)."""
    found = [*_stable_failed(timeline, max_gap_s), *_silences(timeline, max_gap_s)]
    return tuple(sorted(found, key=lambda o: o.start))


def _stable_failed(timeline: CallTimeline, max_gap_s: float) -> list[Outage]:
    seconds = len(timeline.stable_requests)
    width = max(int(round(max_gap_s)), 1)
    if not seconds or timeline.stable_failures.sum() < MIN_STABLE_FAILURES:
        return []
    slices = np.arange(seconds) // width
    requests = np.bincount(slices, weights=timeline.stable_requests)
    failures = np.bincount(slices, weights=timeline.stable_failures)
    # A slice is judged against stable's rate in the slices that are not down on their face (under OUTAGE_SHARE), so
    # an outage spanning several slices cannot raise its own bar.
    share = failures / np.maximum(requests, 1.0)
    calm = share < OUTAGE_SHARE
    baseline = failures[calm].sum() / max(requests[calm].sum(), 1.0)
    down = (failures >= MIN_STABLE_FAILURES) & (share >= max(OUTAGE_SHARE, OUTAGE_FACTOR * baseline))
    outages = []
    for first, last in _runs(np.flatnonzero(down)):
        begin, end = first * width, min((last + 1) * width, seconds)
        count = int(failures[first : last + 1].sum())
        total = int(requests[first : last + 1].sum())
        detail = f"stable failed {count} of {total} requests"
        outages.append(Outage("stable_failed", _at(timeline, begin), _at(timeline, end), detail, end >= seconds))
    return outages


def _silences(timeline: CallTimeline, max_gap_s: float) -> list[Outage]:
    empty = np.flatnonzero(timeline.calls == 0)
    outages = []
    for first, last in _runs(empty):
        if last - first + 1 > max_gap_s:
            ongoing = last + 1 >= len(timeline.calls)
            detail = "no model calls"
            outages.append(Outage("no_calls", _at(timeline, first), _at(timeline, last + 1), detail, ongoing))
    return outages


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive integers grouped: (first, last) of each run."""
    if not len(indices):
        return []
    breaks = np.flatnonzero(np.diff(indices) > 1)
    starts = [int(indices[0]), *(int(indices[b + 1]) for b in breaks)]
    ends = [*(int(indices[b]) for b in breaks), int(indices[-1])]
    return list(zip(starts, ends, strict=True))


def _at(timeline: CallTimeline, second: int) -> datetime:
    return datetime.fromtimestamp(timeline.start + second, UTC)
