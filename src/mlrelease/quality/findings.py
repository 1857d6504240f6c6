"""GX validation results as findings: one entry per expectation and one line per failure.

A failure line names the table, the column, the partition and the numbers, in the words the suite
file gives the expectation (`meta.says`), e.g. `packages.weight_kg date=2026-11-28: expected values lie in
[0.01, 1000.0]; 18 of 600 rows (3.0 %) do not, e.g. -3.1, -0.52`.
"""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def observed(result: dict[str, Any]) -> str:
    """What GX saw, in words: the share of rows that broke a row-wise expectation, or the observed aggregate."""
    res = result.get("result") or {}
    kwargs = result["expectation_config"]["kwargs"]
    if result.get("exception_info", {}).get("raised_exception"):
        return f"could not be evaluated: {result['exception_info']['exception_message']}"
    if "unexpected_count" in res and res.get("element_count"):
        count, total = res["unexpected_count"], res["element_count"]
        text = f"{count} of {total} rows ({100 * count / total:.1f} %) do not"
        examples = [v for v in (res.get("partial_unexpected_list") or []) if not isinstance(v, bool)][:3]
        return text + (f", e.g. {', '.join(_number(v) for v in examples)}" if examples else "")
    if "observed_value" in res:
        value = res["observed_value"]
        if "min_value" in kwargs or "max_value" in kwargs:
            bounds = f"[{_number(kwargs.get('min_value'))}, {_number(kwargs.get('max_value'))}]"
            return f"observed {_number(value)}, allowed {bounds}"
        return f"observed {value}"
    return "failed"


def entries(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per expectation of a validation result: type, column, success, observed, what it says."""
    out = []
    for r in result["results"]:
        config = r["expectation_config"]
        meta, kwargs = config.get("meta") or {}, config["kwargs"]
        column = meta.get("column_of") or kwargs.get("column") or (kwargs.get("column_list") or [None])[0]
        out.append(
            {
                "type": config["type"],
                "column": column,
                "success": bool(r["success"]),
                "observed": observed(r),
                "says": meta.get("says", config["type"]),
            }
        )
    return out


def failure_line(table: str, partition: str, entry: dict[str, Any]) -> str:
    """The one line a failed expectation gets: table.column partition: what was expected; what was seen."""
    return f"{table}.{entry['column'] or 'table'} {partition}: expected {entry['says']}; {entry['observed']}"
