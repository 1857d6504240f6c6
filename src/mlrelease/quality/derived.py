"""Row-level facts that need other partitions or tables, added as boolean columns the GX suites check.

GX validates one batch at a time; whether a key was already published yesterday or an order's package
exists is a question about other batches. The answers are computed here, one `_…` column each, and the
suite holds the expectation (and its tolerance), so every verdict still lives in the suite files.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta

import numpy as np
import pandas as pd

from mlrelease.data.schema import Table
from mlrelease.quality.partitions import day_start, rows_between

# orders' foreign keys and the table each must exist in
REFERENCES = {"user_id": "users", "package_id": "packages", "route_id": "routes"}


def key_hashes(table: Table, frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per row naming its identity: the key, plus the event time for snapshot tables."""
    columns = [table.key] if table.unique_key else [table.key, table.timestamp]
    return pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()


def row_hashes(table: Table, frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per row over every value except the event time: a re-published row hashes the same."""
    columns = [c for c in frame.columns if c != table.timestamp and not c.startswith("_")]
    return pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()


def _seen(values: np.ndarray, earlier: Iterable[np.ndarray]) -> np.ndarray:
    pool = [e for e in earlier if len(e)]
    return np.isin(values, np.concatenate(pool)) if pool else np.zeros(len(values), dtype=bool)


def with_derived_columns(
    table: Table,
    frame: pd.DataFrame,
    day: date,
    earlier_keys: list[np.ndarray],
    earlier_rows: list[np.ndarray],
    known_keys: dict[str, np.ndarray],
) -> pd.DataFrame:
    """The batch plus `_in_partition_day`, `_key_is_new`, `_row_is_new` (and `_<fk>_exists` for orders)."""
    out = frame.copy()
    begin = day_start(day)
    out["_in_partition_day"] = rows_between(out, table.timestamp, begin, begin + timedelta(days=1)).to_numpy()
    out["_key_is_new"] = ~_seen(key_hashes(table, frame), earlier_keys)
    out["_row_is_new"] = ~_seen(row_hashes(table, frame), earlier_rows)
    if table.name == "orders":
        for column, referenced in REFERENCES.items():
            out[f"_{column}_exists"] = np.isin(frame[column].to_numpy(), known_keys[referenced])
    return out
