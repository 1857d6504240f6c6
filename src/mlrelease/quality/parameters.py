"""Suite parameters derived from the table's own history, following the rule each expectation declares.

An expectation whose bound depends on history names its parameters (`{"$PARAMETER": "rows_min"}`) and
says in `meta.history` how to derive them: the statistic, the tolerance (`low`, `high`), a sampling
allowance (`z` standard errors) and the smallest batch it judges (`min_rows`). The rule lives in the
suite file; this module only evaluates it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

Bounds = tuple[float | None, float | None]


def _median_rows(
    rule: dict[str, Any], column: str | None, batch: pd.DataFrame, ref: pd.DataFrame, counts: list[int]
) -> Bounds:
    if not counts:
        return 1, None  # no history to scale from: only an empty partition fails
    median = float(pd.Series(counts).median())
    if median == 0:
        return 0, None
    return max(1, math.floor(rule["low"] * median)), math.ceil(rule["high"] * median)


def _stdev(
    rule: dict[str, Any], column: str | None, batch: pd.DataFrame, ref: pd.DataFrame, counts: list[int]
) -> Bounds:
    if ref.empty or len(batch) < rule.get("min_rows", 0):
        return 0, None
    return rule["low"] * float(pd.to_numeric(ref[column], errors="coerce").std()), None


def _distinct(
    rule: dict[str, Any], column: str | None, batch: pd.DataFrame, ref: pd.DataFrame, counts: list[int]
) -> Bounds:
    if ref.empty or len(batch) < rule.get("min_rows", 0):
        return 0, None
    return max(1, math.ceil(rule["low"] * ref[column].nunique())), None


def _mean(
    rule: dict[str, Any], column: str | None, batch: pd.DataFrame, ref: pd.DataFrame, counts: list[int]
) -> Bounds:
    values = pd.to_numeric(ref[column], errors="coerce") if not ref.empty else pd.Series(dtype=float)
    if values.count() < 2 or batch.empty:
        return None, None
    # The tolerance on the level, widened by z standard errors of this batch's mean (small batches are noisy).
    noise = rule.get("z", 0.0) * float(values.std()) / math.sqrt(len(batch))
    mean = float(values.mean())
    return rule["low"] * mean - noise, rule["high"] * mean + noise


STATISTICS: dict[str, Callable[[dict[str, Any], str | None, pd.DataFrame, pd.DataFrame, list[int]], Bounds]] = {
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
    params: dict[str, float | None] = {}
    for expectation in suite["expectations"]:
        rule = (expectation.get("meta") or {}).get("history")
        if rule is None:
            continue
        kwargs = expectation["kwargs"]
        low, high = STATISTICS[rule["statistic"]](rule, kwargs.get("column"), batch, reference, reference_counts)
        for key, value in (("min_value", low), ("max_value", high)):
            name = _parameter(kwargs, key)
            if name is not None:
                params[name] = value
    return params
