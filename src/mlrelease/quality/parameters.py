"""Suite parameters derived from the table's own history, following the rule each expectation declares.

An expectation whose bound depends on history names its parameters (`{"$PARAMETER": "rows_min"}`) and
says in `meta.history` how to derive them: the statistic, the tolerance (`low`, `high`), a sampling
allowance (`z` standard errors) and the smallest batch it judges (`min_rows`). The rule lives in the
suite file; this module only evaluates it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any, Protocol

import pandas as pd

Bounds = tuple[float | None, float | None]


class ReferenceStats(Protocol):
    """What the rules read of the reference rows: one engine computes it (pandas here, Spark in spark/)."""

    @property
    def empty(self) -> bool:
        """No reference rows at all."""
        ...

    def numeric(self, column: str) -> tuple[int, float, float]:
        """Count of numeric values, their mean and sample standard deviation (NaN where undefined)."""
        ...

    def distinct(self, column: str) -> int:
        """Distinct non-null values of the column."""
        ...


class FrameStats:
    """ReferenceStats of a pandas DataFrame."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame

    @property
    def empty(self) -> bool:
        """No reference rows at all."""
        return self.frame.empty

    def numeric(self, column: str) -> tuple[int, float, float]:
        """Count, mean and sample standard deviation of the column's numeric values."""
        values = pd.to_numeric(self.frame[column], errors="coerce")
        return int(values.count()), float(values.mean()), float(values.std())

    def distinct(self, column: str) -> int:
        """Distinct non-null values of the column."""
        return int(self.frame[column].nunique())


Rule = Callable[[dict[str, Any], str, int, ReferenceStats, list[int]], Bounds]


def _median_rows(rule: dict[str, Any], column: str, rows: int, ref: ReferenceStats, counts: list[int]) -> Bounds:
    if not counts:
        return 1, None  # no history to scale from: only an empty partition fails
    median = float(statistics.median(counts))
    if median == 0:
        return 0, None
    return max(1, math.floor(rule["low"] * median)), math.ceil(rule["high"] * median)


def _stdev(rule: dict[str, Any], column: str, rows: int, ref: ReferenceStats, counts: list[int]) -> Bounds:
    if ref.empty or rows < rule.get("min_rows", 0):
        return 0, None
    return rule["low"] * ref.numeric(column)[2], None


def _distinct(rule: dict[str, Any], column: str, rows: int, ref: ReferenceStats, counts: list[int]) -> Bounds:
    if ref.empty or rows < rule.get("min_rows", 0):
        return 0, None
    return max(1, math.ceil(rule["low"] * ref.distinct(column))), None


def _mean(rule: dict[str, Any], column: str, rows: int, ref: ReferenceStats, counts: list[int]) -> Bounds:
    count, mean, stdev = ref.numeric(column) if not ref.empty else (0, math.nan, math.nan)
    if count < 2 or rows == 0:
        return None, None
    # The tolerance on the level, widened by z standard errors of this batch's mean (small batches are noisy).
    noise = rule.get("z", 0.0) * stdev / math.sqrt(rows)
    return rule["low"] * mean - noise, rule["high"] * mean + noise


STATISTICS: dict[str, Rule] = {
    "median_rows": _median_rows,
    "stdev": _stdev,
    "distinct": _distinct,
    "mean": _mean,
}


def _parameter(kwargs: dict[str, Any], key: str) -> str | None:
    value = kwargs.get(key)
    return value.get("$PARAMETER") if isinstance(value, dict) else None


def suite_parameters(
    suite: dict[str, Any], batch: pd.DataFrame, reference: pd.DataFrame, reference_counts: list[int]
) -> dict[str, float | None]:
    """Every `$PARAMETER` of the suite, evaluated for this batch against its reference rows and daily counts."""
    return parameters_from(suite, len(batch), FrameStats(reference), reference_counts)


def parameters_from(
    suite: dict[str, Any], rows: int, reference: ReferenceStats, reference_counts: list[int]
) -> dict[str, float | None]:
    """suite_parameters for a batch of `rows` rows, reading the reference through any engine's ReferenceStats."""
    params: dict[str, float | None] = {}
    for expectation in suite["expectations"]:
        rule = (expectation.get("meta") or {}).get("history")
        if rule is None:
            continue
        kwargs = expectation["kwargs"]
        column = kwargs.get("column", "")
        low, high = STATISTICS[rule["statistic"]](rule, column, rows, reference, reference_counts)
        for key, value in (("min_value", low), ("max_value", high)):
            name = _parameter(kwargs, key)
            if name is not None:
                params[name] = value
    return params
