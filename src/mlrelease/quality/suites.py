"""Great Expectations suites for the source tables, derived from the schema kept in `mlrelease.data.schema`."""

from __future__ import annotations

from typing import Any

import great_expectations.expectations as gxe

from mlrelease.data.schema import Table

# pandas dtype names accepted for each schema type (nullable extension types included).
_DTYPES = {
    "int64": ["int64", "Int64"],
    "float64": ["float64", "Float64"],
    "string": ["object", "str", "string", "StringDtype"],
    "bool": ["bool", "boolean"],
}


def build_expectations(table: Table, row_bounds: tuple[int, int]) -> list[Any]:
    """Schema, types, nulls, ranges, categorical sets, key uniqueness and row count for one table."""
    expectations: list[Any] = [
        gxe.ExpectTableColumnsToMatchSet(column_set=table.column_names, exact_match=True),
        gxe.ExpectTableRowCountToBeBetween(min_value=row_bounds[0], max_value=row_bounds[1]),
    ]
    for col in table.columns:
        if col.dtype in _DTYPES:
            # GX cannot name a timezone-aware dtype in a type list; event times are parsed (and so type-checked)
            # when the window is read, and the materialize step checks them against the arrow schema.
            expectations.append(gxe.ExpectColumnValuesToBeInTypeList(column=col.name, type_list=_DTYPES[col.dtype]))
        if not col.nullable:
            expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=col.name))
        if col.min_value is not None or col.max_value is not None:
            expectations.append(
                gxe.ExpectColumnValuesToBeBetween(column=col.name, min_value=col.min_value, max_value=col.max_value)
            )
        if col.allowed is not None:
            expectations.append(gxe.ExpectColumnValuesToBeInSet(column=col.name, value_set=list(col.allowed)))
    if table.unique_key:
        expectations.append(gxe.ExpectColumnValuesToBeUnique(column=table.key))
    else:  # snapshot tables: one row per entity per event time
        expectations.append(gxe.ExpectCompoundColumnsToBeUnique(column_list=[table.key, table.timestamp]))
    return expectations
