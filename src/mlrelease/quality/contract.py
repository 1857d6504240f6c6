"""The physical contract of a source partition: exactly the schema's columns, each with its arrow type.

Checked on the parquet schema before any row is read, so a renamed column, a type change or a
timezone-naive event time is one named verdict rather than a crash further down.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from mlrelease.data.schema import Table

_ARROW_TYPES: dict[str, Callable[[pa.DataType], bool]] = {
    "int64": pa.types.is_integer,
    "float64": pa.types.is_floating,
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "bool": pa.types.is_boolean,
    "timestamp": pa.types.is_timestamp,
}


def contract_problems(table: Table, schema: pa.Schema) -> list[tuple[str, str]]:
    """(column, problem) for every way the partition's schema breaks the table's contract; empty when it holds."""
    problems = []
    expected = {c.name: c for c in table.columns}
    for name in schema.names:
        if name not in expected:
            problems.append((name, f"unexpected column {name} ({schema.field(name).type})"))
    for name, column in expected.items():
        if name not in schema.names:
            problems.append((name, f"missing column {name}"))
            continue
        arrow_type = schema.field(name).type
        if not _ARROW_TYPES[column.dtype](arrow_type):
            problems.append((name, f"type {arrow_type}, expected {column.dtype}"))
        elif column.dtype == "timestamp" and arrow_type.tz is None:
            problems.append((name, f"type {arrow_type} has no time zone; event times must be UTC-aware"))
    return problems
