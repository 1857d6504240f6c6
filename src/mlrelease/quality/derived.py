"""Row-level facts that need other partitions or tables, added as boolean columns the GX suites check.

GX validates one batch at a time; whether a key was already published yesterday or an order's package
exists is a question about other batches. The answers are computed here, one `_…` column each, and the
suite holds the expectation (and its tolerance), so every verdict still lives in the suite files.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np
import pandas as pd

from mlrelease.data.schema import Table
from mlrelease.quality.partitions import day_start, rows_between

# orders' foreign keys and the table each must exist in
REFERENCES = {"user_id": "users", "package_id": "packages", "route_id": "routes"}
# ... and those whose entity must exist by the order's event time (a point-in-time join finds no row otherwise).
# Only event tables: a snapshot table's history starts somewhere, and an order just after its first snapshot of
# a long-known user is not an error of the order.
TEMPORAL_REFERENCES = ("package_id",)


def key_hashes(table: Table, frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per row naming its identity: the key, plus the event time for snapshot tables."""
    columns = [table.key] if table.unique_key else [table.key, table.timestamp]
    return pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()


def row_hashes(table: Table, frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per row over every value except the event time: a re-published row hashes the same."""
    columns = [c for c in frame.columns if c != table.timestamp and not c.startswith("_")]
    return pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()


def content_hashes(table: Table, frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per row over what the row says (Table.content_columns): the same content under new keys matches."""
    return pd.util.hash_pandas_object(frame[table.content_columns], index=False).to_numpy()


def first_seen(table: Table, frames: Iterable[pd.DataFrame]) -> pd.Series:
    """Each key's earliest event time over the given partitions: since when a point-in-time join finds it."""
    parts = [f[[table.key, table.timestamp]] for f in frames]
    if not parts:
        return pd.Series([], dtype="datetime64[ns, UTC]")
    pooled = pd.concat(parts, ignore_index=True)
    return pooled.groupby(table.key)[table.timestamp].min()


@dataclass
class History:
    """What earlier partitions (and the referenced tables) published: hashes, keys and since when each key exists."""

    keys: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    contents: list[np.ndarray] = field(default_factory=list)
    known_keys: dict[str, np.ndarray] = field(default_factory=dict)  # referenced table -> keys up to the day
    since: dict[str, pd.Series] = field(default_factory=dict)  # referenced table -> key -> first event time


def _seen(values: np.ndarray, earlier: Iterable[np.ndarray]) -> np.ndarray:
    pool = [e for e in earlier if len(e)]
    return np.isin(values, np.concatenate(pool)) if pool else np.zeros(len(values), dtype=bool)


def _existed_at_event(frame: pd.DataFrame, column: str, timestamp: str, since: pd.Series) -> np.ndarray:
    """True where the referenced key had a row at or before the event (or exists nowhere: the orphan check's)."""
    first = pd.to_datetime(frame[column].map(since), utc=True)  # NaT where the key is unknown (even if all are)
    return (first.isna() | (first <= frame[timestamp])).to_numpy()


def with_derived_columns(table: Table, frame: pd.DataFrame, day: date, history: History) -> pd.DataFrame:
    """The batch plus its `_…` columns: where it lies, what is new, and (orders) what it references and since when.

    `_content_is_new` (event tables): the row's content (Table.content_columns) appears neither in an earlier
    partition nor earlier in this batch, so an extract re-published or appended twice under new keys shows.
    """
    out = frame.copy()
    begin = day_start(day)
    out["_in_partition_day"] = rows_between(out, table.timestamp, begin, begin + timedelta(days=1)).to_numpy()
    out["_key_is_new"] = ~_seen(key_hashes(table, frame), history.keys)
    out["_row_is_new"] = ~_seen(row_hashes(table, frame), history.rows)
    if table.unique_key:
        content = content_hashes(table, frame)
        out["_content_is_new"] = ~(_seen(content, history.contents) | pd.Series(content).duplicated().to_numpy())
    if table.name == "orders":
        for column, referenced in REFERENCES.items():
            out[f"_{column}_exists"] = np.isin(frame[column].to_numpy(), history.known_keys[referenced])
        for column in TEMPORAL_REFERENCES:
            since = history.since[REFERENCES[column]]
            out[f"_{column}_existed_at_event"] = _existed_at_event(frame, column, table.timestamp, since)
    return out
