"""Outages in a stage's window: evidence that serving itself, not the candidate, was down (pure).

A stage judges the candidate against stable's calls in the same window. When serving was down during that
window (Triton restarted, every gateway process died, the stable version failed), both arms were measured
through the fault: a pass would say nothing about the candidate, so such a window never passes (see
`guardrails.withhold_pass`). Two kinds of evidence, both read from the model calls of the window:

- `stable_failed`: the stable version's own calls had hard failures (errors, timeouts), at least
  `MIN_STABLE_FAILURES` of them in one burst. Stable has served for days; when its calls keep failing, serving
  is down, whatever the candidate does (one stray timeout on a busy node is not an outage).
- `no_calls`: no model call at all (any version, any cohort) for longer than `max_gap_s` while the window
  runs, including a silence at its start or at its end (an outage still going on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

# As many failed calls as the gateway's fast guard needs to trip (`guard.failures_to_trip`): fewer in one burst
# is a stray slow call, not serving being down.
MIN_STABLE_FAILURES = 3


@dataclass(frozen=True)
class CallTimeline:
    """When model calls happened in a window (unix seconds): every call, and stable's hard failures."""

    calls: Sequence[float] = ()
    stable_failures: Sequence[float] = ()


@dataclass(frozen=True)
class Outage:
    """One stretch of a window in which serving was down: what showed it, from when, until when."""

    kind: Literal["stable_failed", "no_calls"]
    start: datetime
    end: datetime
    detail: str

    @property
    def duration_s(self) -> float:
        """How long it lasted (0 for a single failed call)."""
        return (self.end - self.start).total_seconds()

    def describe(self) -> str:
        """One phrase for reasons, alerts and the report."""
        return f"{self.detail} at {self.start:%H:%M:%S} for {self.duration_s:.1f} s"

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form for the record, the evidence trail and the step's result."""
        return {
            "kind": self.kind,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "duration_s": round(self.duration_s, 3),
            "detail": self.detail,
        }


def find_outages(timeline: CallTimeline, since: datetime, until: datetime, max_gap_s: float) -> tuple[Outage, ...]:
    """Every outage in [since, until): bursts of stable's failures (those closer than `max_gap_s` form one burst;
    one counts from `MIN_STABLE_FAILURES` failures), then
    every silence longer than `max_gap_s` between two calls or at either end of the window, oldest first."""
    start, end = since.timestamp(), until.timestamp()
    found = [
        Outage("stable_failed", _at(first), _at(last), f"stable failed {count} call{'s' * (count > 1)}")
        for first, last, count in _bursts(sorted(t for t in timeline.stable_failures if start <= t < end), max_gap_s)
        if count >= MIN_STABLE_FAILURES
    ]
    moments = [start, *sorted(t for t in timeline.calls if start <= t < end), end]
    for before, after in zip(moments, moments[1:], strict=False):
        if after - before > max_gap_s:
            still = " (still silent)" if after == end else ""
            found.append(Outage("no_calls", _at(before), _at(after), f"no model calls{still}"))
    return tuple(sorted(found, key=lambda o: o.start))


def _bursts(times: list[float], max_gap_s: float) -> list[tuple[float, float, int]]:
    """Sorted moments grouped where consecutive ones lie within `max_gap_s`: (first, last, count) each."""
    bursts: list[tuple[float, float, int]] = []
    for t in times:
        if bursts and t - bursts[-1][1] <= max_gap_s:
            first, _, count = bursts[-1]
            bursts[-1] = (first, t, count + 1)
        else:
            bursts.append((t, t, 1))
    return bursts


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
