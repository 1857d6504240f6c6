"""Parsing of timestamps and data-interval windows; never reads the clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta


def parse_timestamp(value: str, *, name: str = "timestamp") -> datetime:
    """Parse an ISO-8601 date or datetime into an aware UTC datetime; naive input is taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise ValueError(
            f"bad {name} {value!r}: expected ISO-8601 like 2026-11-29 or 2026-11-29T02:00:00+00:00"
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def parse_date(value: str, *, name: str = "date") -> date:
    """Parse a calendar date (YYYY-MM-DD), naming the argument on error."""
    try:
        return date.fromisoformat(value.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"bad {name} {value!r}: expected a date like 2026-11-29") from None


@dataclass(frozen=True)
class Window:
    """A half-open time window [start, end) in UTC, typically a DAG run's data interval."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("window bounds must be timezone-aware")
        if self.end <= self.start:
            raise ValueError(f"empty window: end {self.end.isoformat()} is not after start {self.start.isoformat()}")

    @classmethod
    def parse(cls, start: str, end: str) -> Window:
        """Build a window from two ISO-8601 strings, with errors that name the bad argument."""
        return cls(parse_timestamp(start, name="--start"), parse_timestamp(end, name="--end"))

    def widened(self, overlap: timedelta) -> Window:
        """The window with its start moved back by `overlap`, to pick up late-arriving rows."""
        return Window(self.start - overlap, self.end)

    def days(self) -> list[date]:
        """Every calendar day that the window touches."""
        first = self.start.date()
        last = (self.end - timedelta(microseconds=1)).date()
        return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def run_key(end: datetime) -> str:
    """Artifact folder name for a run: its data interval's end, e.g. 20261129T020000Z."""
    return end.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def parse_run_key(key: str) -> datetime:
    """The data interval end a run key names (inverse of `run_key`)."""
    try:
        return datetime.strptime(key, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"run key {key!r} is not like 20261129T020000Z") from None
