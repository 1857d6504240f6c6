"""Reading the date-partitioned parquet sources for a time window, with errors that name the partition."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mlrelease.errors import StepError
from mlrelease.timewindow import Window


def partition_file(table_dir: Path, day: date) -> Path:
    """The parquet file holding one day of a table."""
    return table_dir / f"date={day.isoformat()}" / "part-0.parquet"


def window_partitions(table_dir: Path, window: Window, *, allow_missing: bool = False) -> list[Path]:
    """Partition files covering the window; a missing day is an error that names it unless allowed."""
    files = []
    for day in window.days():
        path = partition_file(table_dir, day)
        if not path.is_file():
            if allow_missing:
                continue
            raise StepError(f"source {table_dir.name}: partition date={day} is missing ({path})")
        files.append(path)
    return files


def read_schema(path: Path) -> pa.Schema:
    """The arrow schema of one partition; an unreadable file is an error that names it."""
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise StepError(f"source partition {path} is unreadable: {exc}") from None


def read_window(
    table_dir: Path, window: Window, columns: list[str] | None = None, *, allow_missing: bool = False
) -> pd.DataFrame:
    """Rows of a table whose event_timestamp falls in [window.start, window.end)."""
    frames = []
    for path in window_partitions(table_dir, window, allow_missing=allow_missing):
        try:
            frames.append(pq.read_table(path, columns=columns).to_pandas())
        except (OSError, pa.ArrowException) as exc:
            raise StepError(f"source partition {path} is unreadable: {exc}") from None
    if not frames:
        return pd.DataFrame(columns=columns or [])
    frame = pd.concat(frames, ignore_index=True)
    ts = pd.to_datetime(frame["event_timestamp"], utc=True)
    return frame[(ts >= window.start) & (ts < window.end)].reset_index(drop=True)


def covered_hours(table_dir: Path, window: Window) -> float:
    """Hours of the window that fall on days whose partition exists (how much history is really there)."""
    total = 0.0
    for day in window.days():
        if partition_file(table_dir, day).is_file():
            day_start = pd.Timestamp(day, tz="UTC").to_pydatetime()
            overlap = min(window.end, day_start + timedelta(days=1)) - max(window.start, day_start)
            total += overlap.total_seconds() / 3600
    return total


def reference_window(window: Window, days: int) -> Window:
    """The `days` whole days right before the window starts: the baseline for drift checks."""
    return Window(window.start - timedelta(days=days), window.start)
