"""Completeness per hour of the day: a feed that went quiet for an hour shows against the same hours of history.

The day-level row-count band (0.5x - 2x of history) cannot see one lost hour (~4 % of a day), nor a column that
is empty for one hour while the day's null share stays small. Per hour of the slice and per column, the values
present (non-null) are compared with what the reference days predict for this batch: the batch's rows times the
share of all reference rows that carried a value in that hour. An hour is a finding when fewer than LOW of the
expected values arrived AND the binomial lower tail of that count is below ALPHA, so a thin hour at night is not
flagged for noise while an empty hour of 25 expected rows is (P = e^-25 ~ 1e-11).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import binom

from mlrelease.data.schema import Table

LOW = 0.5  # fewer than half the expected values in an hour ...
ALPHA = 1e-6  # ... and that few this unlikely by chance (24 hours x ~8 columns x 4 tables: ~1e-3 a night)
MIN_EXPECTED = 5.0  # hours where history expects fewer values are not judged (too few to say anything)
ROWS = "table"  # the finding's column when whole rows are missing


@dataclass(frozen=True)
class HourGap:
    """One hour of the day where a column (or whole rows: column ROWS) had far fewer values than history says."""

    column: str
    hour: int
    present: int
    expected: float
    reference_share: float  # share of the reference's rows in that hour that had a value (1.0 for rows)

    def line(self, table: str, partition: str, reference_days: int) -> str:
        """The finding's one line, worded like the suite's: table.column partition: expected ...; observed."""
        span = f"{self.hour:02d}:00-{self.hour + 1:02d}:00 UTC"
        what = "rows" if self.column == ROWS else "values"
        return (
            f"{table}.{self.column} {partition}: expected every hour of the day as complete as the same hour of "
            f"{reference_days} reference days; {span} has {self.present} {what}, {self.expected:.1f} expected"
            + ("" if self.column == ROWS else f" ({100 * self.reference_share:.0f} % of that hour's rows had one)")
        )


def present_per_hour(frame: pd.DataFrame, timestamp: str, columns: list[str]) -> np.ndarray:
    """Rows (first column) and non-null values of each column per hour of the day: a 24 x (1 + columns) array."""
    hours = frame[timestamp].dt.hour.to_numpy()
    present = np.column_stack([np.ones(len(frame), dtype=bool), frame[columns].notna().to_numpy()])
    out = np.zeros((24, 1 + len(columns)), dtype="int64")
    np.add.at(out, hours, present.astype("int64"))
    return out


def judged_columns(table: Table, present: list[str]) -> list[str]:
    """The columns whose values are counted per hour: every contract column but the event time."""
    return [c for c in table.column_names if c != table.timestamp and c in present]


def frame_hour_counts(
    table: Table, batch: pd.DataFrame, reference: pd.DataFrame
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The judged columns and the per-hour counts of a pandas batch and of its reference (gaps_from_counts' input)."""
    if batch.empty or reference.empty:
        return [], np.zeros((24, 1), dtype="int64"), np.zeros((24, 1), dtype="int64")
    columns = judged_columns(table, list(batch.columns))
    ts = table.timestamp
    return columns, present_per_hour(batch, ts, columns), present_per_hour(reference, ts, columns)


def hour_gaps(table: Table, batch: pd.DataFrame, reference: pd.DataFrame) -> list[HourGap]:
    """Hours whose rows (or a column's values) fell far below the reference's share (pandas frames)."""
    return gaps_from_counts(*frame_hour_counts(table, batch, reference))


def gaps_from_counts(columns: list[str], now: np.ndarray, past: np.ndarray) -> list[HourGap]:
    """hour_gaps from per-hour counts (24 x (1 + columns), rows first) that any engine may have counted.

    Rows: each of the batch's rows falls in hour h with the reference's share of rows in h. A column's values:
    each row present in hour h has a value with the reference's share in that same hour (so an hour that lost
    its rows is the rows' finding only, and a column is judged against the rows that did arrive).
    """
    names = [ROWS, *columns]
    batch_rows, reference_rows = int(now[:, 0].sum()), int(past[:, 0].sum())
    if batch_rows == 0 or reference_rows == 0:
        return []
    rows_then = past[:, :1]
    with np.errstate(invalid="ignore", divide="ignore"):
        value_share = np.where(rows_then > 0, past[:, 1:] / rows_then, 0.0)
    share = np.column_stack([past[:, 0] / reference_rows, value_share])
    trials = np.column_stack([np.full(24, batch_rows), np.repeat(now[:, :1], len(columns), axis=1)])
    expected = share * trials
    low = (now < LOW * expected) & (expected >= MIN_EXPECTED)
    significant = low & (binom.cdf(now, trials, share) < ALPHA)
    return [
        HourGap(
            column=names[col],
            hour=int(hour),
            present=int(now[hour, col]),
            expected=float(expected[hour, col]),
            reference_share=float(share[hour, col]) if col else 1.0,
        )
        for hour, col in zip(*np.nonzero(significant), strict=True)
    ]
