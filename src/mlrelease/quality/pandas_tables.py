"""The pandas engine of validate-data: one table's partitions read into memory, each slice's batch built there.

The embedded default. Each partition is read once from one in-memory copy of its bytes (the digest the ledger
records is of the very bytes checked); the Spark engine (quality/spark_tables.py) answers the same questions
on a cluster. validate-data's verdicts are engine-neutral (steps/validate_data.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import pandas as pd

from mlrelease.data.schema import Table
from mlrelease.quality.contract import contract_problems
from mlrelease.quality.derived import (
    REFERENCES,
    TEMPORAL_REFERENCES,
    History,
    content_hashes,
    first_seen,
    key_hashes,
    row_hashes,
    with_derived_columns,
)
from mlrelease.quality.drift import psi
from mlrelease.quality.hourly import frame_hour_counts
from mlrelease.quality.ledger import PartitionFile
from mlrelease.quality.parameters import FrameStats, ReferenceStats
from mlrelease.quality.partitions import LoadedPartition, Slice, read_partition, rows_between, same_hours
from mlrelease.settings import Settings
from mlrelease.sources import partition_file
from mlrelease.timewindow import Window


def frame_drift(table: Table, current: pd.DataFrame, reference: pd.DataFrame, threshold: float) -> dict[str, Any]:
    """PSI of each drift column of the table, current against reference."""
    out: dict[str, Any] = {}
    for column in table.drift_columns:
        try:
            value = psi(
                pd.to_numeric(reference[column], errors="coerce").to_numpy(),
                pd.to_numeric(current[column], errors="coerce").to_numpy(),
            )
        except ValueError:
            value = float("inf")
        out[column] = {"psi": value, "threshold": threshold, "ok": value <= threshold, "rows": len(current)}
    return out


@dataclass
class PandasSlice:
    """One slice's batch (with its `_…` columns) and its reference, in memory."""

    table: Table
    batch: pd.DataFrame
    in_run: pd.DataFrame  # the run's rows of the day, for the per-hour counts
    reference_rows: pd.DataFrame
    counts: list[int]
    outside_run_rows: int

    @property
    def rows(self) -> int:
        """Rows GX validates."""
        return len(self.batch)

    @property
    def reference(self) -> ReferenceStats:
        """The reference rows, as the suite's history rules read them."""
        return FrameStats(self.reference_rows)

    def drift(self, threshold: float) -> dict[str, Any]:
        """PSI per drift column of this batch against the same hours of the reference days."""
        return frame_drift(self.table, self.batch, self.reference_rows, threshold)

    def hour_counts(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The judged columns and the per-hour counts of this slice and of its reference."""
        return frame_hour_counts(self.table, self.in_run, self.reference_rows)


class PandasTableCheck:
    """Everything validate-data reads of one table: its run slices, the reference days, earlier keys."""

    def __init__(self, table: Table, settings: Settings, slices: list[Slice], reference_days: list[date]) -> None:
        self.table = table
        self.slices = slices
        wanted = sorted({*reference_days, *(s.partition.day for s in slices)})
        self.loaded: dict[date, LoadedPartition] = {}
        for day in wanted:
            path = partition_file(settings.offline_dir / table.name, day)
            if path.is_file():
                self.loaded[day] = read_partition(PartitionFile(table.name, day, path), table.timestamp)
        self.contract = {day: contract_problems(table, lp.schema) for day, lp in self.loaded.items()}
        # A day in scope may be another day's reference (a first run checks a week of history at once); a
        # slice is never compared with itself (see `reference`).
        self.reference_days = [d for d in reference_days if d in self.loaded and not self.contract[d]]
        self._hashes: dict[date, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def sha256(self, day: date) -> str:
        """The digest of the bytes read for the day's partition."""
        return self.loaded[day].sha256

    def rows_in_file(self, day: date) -> int:
        """Rows of the day's partition file."""
        return len(self.loaded[day].frame)

    def hashes(self, day: date) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Key, row and (event tables) content hashes of one loaded, contract-clean partition (cached)."""
        if day not in self._hashes:
            table, frame = self.table, self.loaded[day].frame
            content = content_hashes(table, frame) if table.unique_key else None
            self._hashes[day] = (key_hashes(table, frame), row_hashes(table, frame), content)
        return self._hashes[day]

    def earlier(self, day: date) -> History:
        """Key, row and content hashes of every clean loaded partition before `day`."""
        days = [d for d in self.loaded if d < day and not self.contract[d]]
        triples = [self.hashes(d) for d in days]
        return History(
            keys=[k for k, _, _ in triples],
            rows=[r for _, r, _ in triples],
            contents=[c for _, _, c in triples if c is not None],
        )

    def _clean_until(self, day: date) -> list[pd.DataFrame]:
        return [lp.frame for d, lp in self.loaded.items() if d <= day and not self.contract[d]]

    def keys_until(self, day: date) -> np.ndarray:
        """Every key this table published up to and including `day` (what a foreign key may point at)."""
        keys = [frame[self.table.key].to_numpy() for frame in self._clean_until(day)]
        return np.concatenate(keys) if keys else np.array([], dtype="int64")

    def since_until(self, day: date) -> pd.Series:
        """Each key's first event time over the partitions up to and including `day`."""
        return first_seen(self.table, self._clean_until(day))

    def reference(self, hours: tuple[float, float], day: date) -> tuple[pd.DataFrame, list[int]]:
        """The other reference days' rows over the same hours of the day, pooled, and each day's count."""
        days = [d for d in self.reference_days if d != day]
        frames = [same_hours(self.loaded[d].frame, self.table.timestamp, d, hours) for d in days]
        pooled = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return pooled, [len(f) for f in frames]

    def slice_data(self, piece: Slice, known: dict[str, Any]) -> PandasSlice:
        """The slice's batch with its `_…` columns (misfiled rows kept, so the suite names them) and reference."""
        table, day = self.table, piece.partition.day
        frame = self.loaded[day].frame
        begin = pd.Timestamp(day, tz="UTC")
        in_day = rows_between(frame, table.timestamp, begin, begin + pd.Timedelta(days=1))
        in_run = rows_between(frame, table.timestamp, piece.start, piece.end)
        history = self.earlier(day)
        if table.name == "orders":
            history.known_keys = {ref: known[ref].keys_until(day) for ref in REFERENCES.values()}
            temporal = [REFERENCES[column] for column in TEMPORAL_REFERENCES]
            history.since = {ref: known[ref].since_until(day) for ref in temporal}
        batch = with_derived_columns(table, frame[in_run | ~in_day].reset_index(drop=True), day, history)
        reference, counts = self.reference(piece.hours, day)
        return PandasSlice(table, batch, frame[in_run], reference, counts, int((in_day & ~in_run).sum()))

    def interval_drift(self, window: Window, reference: Window, threshold: float) -> dict[str, Any]:
        """PSI of the run's whole interval against the reference window (same hours of the day, larger samples)."""
        ts = self.table.timestamp

        def rows(days: list[date], span: Window) -> pd.DataFrame:
            frames = [self.loaded[d].frame for d in days if d in self.loaded and not self.contract[d]]
            frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[ts])
            return frame[rows_between(frame, ts, span.start, span.end)] if len(frame) else frame

        current = rows([s.partition.day for s in self.slices], window)
        past = rows(self.reference_days, reference)
        if current.empty or past.empty:
            return {}
        return frame_drift(self.table, current, past, threshold)

    def changed_since_read(self) -> list[str]:
        """Partitions whose bytes changed since they were read: none, the bytes were read once into memory."""
        return []
