"""Which source partitions a run validates, which of their rows are the run's, and reading them exactly once.

A partition is read from one in-memory copy of its bytes: the SHA-256 that the ledger records is the
digest of the very bytes that were checked.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mlrelease.errors import StepError
from mlrelease.quality.ledger import PartitionFile
from mlrelease.sources import partition_file
from mlrelease.timewindow import Window


def day_start(day: date) -> datetime:
    """Midnight UTC at the start of `day`."""
    return datetime.combine(day, time(0), tzinfo=UTC)


@dataclass(frozen=True)
class Slice:
    """The rows of one partition that belong to this run: event times in [start, end) within its day."""

    partition: PartitionFile
    start: datetime
    end: datetime

    @property
    def hours(self) -> tuple[float, float]:
        """The slice as hours of its day, e.g. (0.0, 2.0): reference days are compared over the same hours."""
        begin = day_start(self.partition.day)
        return (self.start - begin).total_seconds() / 3600, (self.end - begin).total_seconds() / 3600


@dataclass(frozen=True)
class LoadedPartition:
    """One partition's rows (event times parsed to UTC when the contract allows), digest and arrow schema."""

    partition: PartitionFile
    frame: pd.DataFrame
    sha256: str
    schema: pa.Schema


def run_slices(table_dir: Path, table: str, days: list[date], scope: Window) -> list[Slice]:
    """One slice per day of `days`, clipped to `scope`; a missing partition is an error naming it (exit 2)."""
    slices = []
    for day in days:
        path = partition_file(table_dir, day)
        if not path.is_file():
            raise StepError(
                f"{table}/date={day}: partition is missing ({path}); the extract has not landed: rerun once it has"
            )
        begin = day_start(day)
        slices.append(
            Slice(PartitionFile(table, day, path), max(begin, scope.start), min(begin + timedelta(days=1), scope.end))
        )
    return slices


def read_partition(partition: PartitionFile, timestamp: str) -> LoadedPartition:
    """Read a partition once from memory; an unreadable file is an error naming it (exit 2)."""
    try:
        data = partition.path.read_bytes()
        table = pq.read_table(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as exc:
        raise StepError(f"{partition.name}: partition is unreadable ({partition.path}): {exc}") from None
    frame = table.to_pandas()
    field = table.schema.field(timestamp) if timestamp in table.schema.names else None
    if field is not None and pa.types.is_timestamp(field.type) and field.type.tz is not None:
        frame[timestamp] = pd.to_datetime(frame[timestamp], utc=True)
    return LoadedPartition(partition, frame, hashlib.sha256(data).hexdigest(), table.schema)


def rows_between(frame: pd.DataFrame, timestamp: str, start: datetime, end: datetime) -> pd.Series:
    """Boolean mask of rows whose event time lies in [start, end)."""
    ts = frame[timestamp]
    return (ts >= start) & (ts < end)


def same_hours(frame: pd.DataFrame, timestamp: str, day: date, hours: tuple[float, float]) -> pd.DataFrame:
    """The rows of a reference day over the same hours of the day as a slice."""
    begin = day_start(day)
    mask = rows_between(frame, timestamp, begin + timedelta(hours=hours[0]), begin + timedelta(hours=hours[1]))
    return frame[mask]
