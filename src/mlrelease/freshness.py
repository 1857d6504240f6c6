"""Pure freshness predicates: how far each view's newest materialized event lags a reference time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Freshness:
    """One feature view's freshness at a reference time."""

    view: str
    budget: timedelta
    newest_event: datetime | None
    lag: timedelta | None

    @property
    def ok(self) -> bool:
        """Fresh when something was materialized and its lag is within the budget."""
        return self.lag is not None and self.lag <= self.budget

    def describe(self) -> str:
        """A short human reading, e.g. 'route_features lag 18.2h > budget 9h'."""
        if self.lag is None:
            return f"{self.view} never materialized"
        hours = self.lag.total_seconds() / 3600
        budget = self.budget.total_seconds() / 3600
        return f"{self.view} lag {hours:.1f}h {'<=' if self.ok else '>'} budget {budget:g}h"


def assess(view: str, budget: timedelta, newest_event: datetime | None, at: datetime) -> Freshness:
    """Freshness of `view` at time `at` given its newest materialized event time."""
    lag = None if newest_event is None else max(at - newest_event, timedelta(0))
    return Freshness(view, budget, newest_event, lag)


def parse_budget_hours(view: str, tags: dict[str, str]) -> timedelta:
    """A view's freshness budget from its `freshness_budget_hours` tag; a missing or bad tag names the view."""
    raw = tags.get("freshness_budget_hours")
    if raw is None:
        raise ValueError(f"feature view {view} has no freshness_budget_hours tag")
    try:
        hours = float(raw)
    except ValueError:
        raise ValueError(f"feature view {view} has a non-numeric freshness_budget_hours tag {raw!r}") from None
    if hours <= 0:
        raise ValueError(f"feature view {view} has a non-positive freshness_budget_hours tag {raw!r}")
    return timedelta(hours=hours)
