"""Completeness per hour of the day: a feed that went quiet for an hour shows against the same hours of history.

The day-level row-count band (0.5x - 2x of history) cannot see one lost hour (~4 % of a day), nor a column that
is empty for one hour while the day's null share stays small. Per hour of the slice and per column, the values
present (non-null) are compared with what the reference days predict for this batch: the batch's rows times the
share of all reference rows that carried a value in that hour. An hour is a finding when fewer than LOW of the
expected values arrived AND the binomial lower tail of that count is below ALPHA, so a thin hour at night is not
flagged for noise while an empty hour of 25 expected rows is (P = e^-25 ~ 1e-11).

The hours judged start every half hour (13:00-14:00, 13:30-14:30, ...): an outage from 13:30 to 14:30 halves two
clock hours, which each may pass by chance, but empties one of these. Overlapping flagged hours of a column are
reported as one stretch (13:00-15:00 for two lost hours), trimmed to the half hours that lost more than half
(a 13:00-13:45 outage reads 13:00-13:30), its counts summed over the stretch. Partitions are days: an outage
across midnight (23:30-00:30) is half an hour in each of two partitions, judged separately, and may pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import binom

from mlrelease.data.schema import Table

LOW = 0.5  # fewer than half the expected values in an hour ...
ALPHA = 1e-6  # ... and that few this unlikely by chance (47 hours x ~8 columns x 4 tables: < 2e-3 a night)
MIN_EXPECTED = 5.0  # hours where history expects fewer values are not judged (too few to say anything)
ROWS = "table"  # the finding's column when whole rows are missing
BINS = 48  # half hours of the day: the counts' rows
WINDOW = 2  # bins per judged hour


@dataclass(frozen=True)
class HourGap:
    """A stretch of the day (an hour, or overlapping hours merged) where a column (or whole rows: column ROWS) had
    far fewer values than history says."""

    column: str
    start_minute: int  # of the day, UTC
    end_minute: int
    present: int
    expected: float
    reference_share: float  # share of the reference's rows in the stretch that had a value (1.0 for rows)

    @property
    def span(self) -> str:
        """The stretch as clock times, e.g. 13:30-14:30."""
        return "-".join(f"{m // 60:02d}:{m % 60:02d}" for m in (self.start_minute, self.end_minute))

    def line(self, table: str, partition: str, reference_days: int) -> str:
        """The finding's one line, worded like the suite's: table.column partition: expected ...; observed."""
        what = "rows" if self.column == ROWS else "values"
        return (
            f"{table}.{self.column} {partition}: expected every hour of the day as complete as the same hour of "
            f"{reference_days} reference days; {self.span} UTC has {self.present} {what}, {self.expected:.1f} expected"
            + ("" if self.column == ROWS else f" ({100 * self.reference_share:.0f} % of that hour's rows had one)")
        )


def present_per_hour(frame: pd.DataFrame, timestamp: str, columns: list[str]) -> np.ndarray:
    """Rows (first column) and non-null values of each column per half hour of the day: BINS x (1 + columns)."""
    times = frame[timestamp].dt
    bins = (times.hour * 2 + times.minute // 30).to_numpy()
    present = np.column_stack([np.ones(len(frame), dtype=bool), frame[columns].notna().to_numpy()])
    out = np.zeros((BINS, 1 + len(columns)), dtype="int64")
    np.add.at(out, bins, present.astype("int64"))
    return out


def judged_columns(table: Table, present: list[str]) -> list[str]:
    """The columns whose values are counted per hour: every contract column but the event time."""
    return [c for c in table.column_names if c != table.timestamp and c in present]


def frame_hour_counts(
    table: Table, batch: pd.DataFrame, reference: pd.DataFrame
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The judged columns and the per-hour counts of a pandas batch and of its reference (gaps_from_counts' input)."""
    if batch.empty or reference.empty:
        return [], np.zeros((BINS, 1), dtype="int64"), np.zeros((BINS, 1), dtype="int64")
    columns = judged_columns(table, list(batch.columns))
    ts = table.timestamp
    return columns, present_per_hour(batch, ts, columns), present_per_hour(reference, ts, columns)


def hour_gaps(table: Table, batch: pd.DataFrame, reference: pd.DataFrame) -> list[HourGap]:
    """Hours whose rows (or a column's values) fell far below the reference's share (pandas frames)."""
    return gaps_from_counts(*frame_hour_counts(table, batch, reference))


def _judge(
    now: np.ndarray, past: np.ndarray, stretches: list[tuple[int, int]], totals: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per stretch of half hours [first, end) and per column: (significantly low, present, expected, share).

    Rows: each of the batch's rows (totals[0]) falls in the stretch with the reference's share of rows in it
    (of totals[1]). A column's values: each row that arrived in a half hour has a value with the reference's share
    in that half hour, summed over the stretch (so a stretch that lost rows is the rows' finding only, and a
    column that is full in one half hour and sparse in the next is not blamed for the rows of the full one).
    """
    batch_rows, reference_rows = totals
    rows_then = past[:, :1]
    with np.errstate(invalid="ignore", divide="ignore"):
        value_share = np.where(rows_then > 0, past[:, 1:] / rows_then, 0.0)
    per_half_hour = np.column_stack([batch_rows * past[:, 0] / reference_rows, now[:, :1] * value_share])
    present = np.array([now[first:end].sum(axis=0) for first, end in stretches], dtype="int64")
    expected = np.array([per_half_hour[first:end].sum(axis=0) for first, end in stretches])
    trials = np.column_stack([np.full(len(stretches), batch_rows), np.repeat(present[:, :1], now.shape[1] - 1, axis=1)])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(trials > 0, expected / np.maximum(trials, 1), 0.0)
    low = (present < LOW * expected) & (expected >= MIN_EXPECTED)
    return low & (binom.cdf(present, trials, share) < ALPHA), present, expected, share


def gaps_from_counts(columns: list[str], now: np.ndarray, past: np.ndarray) -> list[HourGap]:
    """hour_gaps from per-half-hour counts (BINS x (1 + columns), rows first) that any engine may have counted."""
    names = [ROWS, *columns]
    totals = (int(now[:, 0].sum()), int(past[:, 0].sum()))
    if 0 in totals:
        return []
    starts = list(range(BINS - WINDOW + 1))
    flagged, *_ = _judge(now, past, [(s, s + WINDOW) for s in starts], totals)
    _, bin_present, bin_expected, _ = _judge(now, past, [(b, b + 1) for b in range(BINS)], totals)
    short = bin_present < LOW * bin_expected  # half hours that are short themselves: a stretch's ends are trimmed
    gaps = []
    for col in range(len(names)):
        for first, last in _stretches([s for s in starts if flagged[s, col]]):
            end = last + WINDOW
            # A column that is near-always set makes an hour half-empty significant: trim to the short half hours.
            while first < end - 1 and not short[first, col]:
                first += 1
            while end - 1 > first and not short[end - 1, col]:
                end -= 1
            significant, present, expected, share = _judge(now, past, [(first, end)], totals)
            if not significant[0, col]:  # what is left after trimming must be a finding on its own
                continue
            gaps.append(
                HourGap(
                    column=names[col],
                    start_minute=30 * first,
                    end_minute=30 * end,
                    present=int(present[0, col]),
                    expected=float(expected[0, col]),
                    reference_share=float(share[0, col]) if col else 1.0,
                )
            )
    return sorted(gaps, key=lambda g: (g.start_minute, names.index(g.column)))


def _stretches(starts: list[int]) -> list[tuple[int, int]]:
    """Overlapping or touching judged hours (their first bins, ascending) merged: (first one's, last one's start)."""
    merged: list[tuple[int, int]] = []
    for start in starts:
        if merged and start <= merged[-1][1] + WINDOW:
            merged[-1] = (merged[-1][0], start)
        else:
            merged.append((start, start))
    return merged
