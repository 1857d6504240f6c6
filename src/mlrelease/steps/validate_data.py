"""Step `validate-data`: Great Expectations suites plus drift against a reference window; any failure fails."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pandas as pd

from mlrelease.data.schema import TABLES, Table
from mlrelease.errors import GateFailed, StepError
from mlrelease.quality.drift import DEFAULT_PSI_THRESHOLD, psi
from mlrelease.quality.report import render_report
from mlrelease.settings import Settings
from mlrelease.sources import covered_hours, read_window, reference_window
from mlrelease.storage import write_json_atomic, write_text_atomic
from mlrelease.timewindow import Window, run_key

ROW_COUNT_TOLERANCE = (0.5, 2.0)  # the window may hold half to twice the reference's hourly volume
MIN_REFERENCE_COVERAGE = 0.5  # a reference with less than half its days present is too thin to compare against


def row_bounds(reference_rows: int, reference_hours: float, window_hours: float) -> tuple[int, int]:
    """Expected row count for the window, scaled from the reference's hourly rate (at least one row)."""
    if reference_rows == 0 or reference_hours <= 0:
        return 1, 2**62
    per_hour = reference_rows / reference_hours
    low, high = ROW_COUNT_TOLERANCE
    return max(1, int(per_hour * window_hours * low)), max(1, int(per_hour * window_hours * high) + 1)


def _observed(result: dict[str, Any]) -> Any:
    res = result.get("result") or {}
    for key in ("observed_value", "unexpected_percent", "unexpected_count"):
        if key in res:
            return f"{key}={res[key]}"
    if result.get("exception_info", {}).get("raised_exception"):
        return result["exception_info"]["exception_message"]
    return ""


def run_suite(context: Any, table: Table, frame: pd.DataFrame, bounds: tuple[int, int]) -> dict[str, Any]:
    """Validate one table's window with GX; return success and one entry per expectation."""
    import great_expectations as gx

    from mlrelease.quality.suites import build_expectations

    asset = context.data_sources.add_pandas(f"{table.name}_source").add_dataframe_asset(name=table.name)
    batch = asset.add_batch_definition_whole_dataframe(f"{table.name}_window")
    suite = context.suites.add(gx.ExpectationSuite(name=f"{table.name}_suite"))
    for expectation in build_expectations(table, bounds):
        suite.add_expectation(expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"{table.name}_validation", data=batch, suite=suite)
    )
    result = definition.run(batch_parameters={"dataframe": frame}).to_json_dict()
    entries = [
        {
            "type": r["expectation_config"]["type"],
            "column": r["expectation_config"]["kwargs"].get("column"),
            "success": bool(r["success"]),
            "observed": _observed(r),
        }
        for r in result["results"]
    ]
    return {"success": bool(result["success"]), "expectations": entries, "gx_result": result}


def drift_report(table: Table, current: pd.DataFrame, reference: pd.DataFrame, threshold: float) -> dict[str, Any]:
    """PSI of each of the table's drift columns against the reference window."""
    out = {}
    for column in table.drift_columns:
        if column not in current or column not in reference:
            continue  # the schema expectation already fails for a missing column
        try:
            value = psi(
                pd.to_numeric(reference[column], errors="coerce").to_numpy(),
                pd.to_numeric(current[column], errors="coerce").to_numpy(),
            )
        except ValueError:
            value = float("inf")
        out[column] = {"psi": value, "threshold": threshold, "ok": value <= threshold}
    return out


def validate_data(
    settings: Settings, window: Window, *, reference_days: int = 7, psi_threshold: float = DEFAULT_PSI_THRESHOLD
) -> dict[str, Any]:
    """Run every table's suite and drift check; write JSON + HTML artifacts; fail naming what broke."""
    warnings.filterwarnings("ignore")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    ref_window = reference_window(window, reference_days) if reference_days > 0 else None
    tables: dict[str, Any] = {}
    failures: list[str] = []
    for table in TABLES.values():
        table_dir = settings.offline_dir / table.name
        current = read_window(table_dir, window)
        reference, ref_hours = pd.DataFrame(), 0.0
        if ref_window is not None:
            ref_hours = covered_hours(table_dir, ref_window)
            if ref_hours < MIN_REFERENCE_COVERAGE * reference_days * 24:
                raise StepError(
                    f"no reference data for {table.name}: only {ref_hours:.0f}h of the {reference_days * 24}h in "
                    f"[{ref_window.start}, {ref_window.end}) have partitions to check drift against; load history "
                    "first or pass --reference-days 0 to validate without drift checks"
                )
            reference = read_window(table_dir, ref_window, allow_missing=True)
        bounds = row_bounds(len(reference), ref_hours, (window.end - window.start).total_seconds() / 3600)
        suite = run_suite(context, table, current, bounds)
        drift = drift_report(table, current, reference, psi_threshold) if ref_window else {}
        failures += [
            f"{table.name}.{e['column'] or 'table'}: {e['type']} ({e['observed']})"
            for e in suite["expectations"]
            if not e["success"]
        ]
        failures += [
            f"{table.name}.{col}: drift PSI {d['psi']:.3f} > {d['threshold']}"
            for col, d in drift.items()
            if not d["ok"]
        ]
        tables[table.name] = {
            "rows": len(current),
            "row_bounds": list(bounds),
            "success": suite["success"],
            "expectations": suite["expectations"],
            "drift": drift,
            "gx": suite["gx_result"],
        }

    out_dir = settings.artifacts_dir / run_key(window.end) / "data_quality"
    summary = {
        "success": not failures,
        "window": {"start": window.start.isoformat(), "end": window.end.isoformat()},
        "reference": None
        if ref_window is None
        else {"start": ref_window.start.isoformat(), "end": ref_window.end.isoformat()},
        "tables": tables,
        "failures": failures,
    }
    write_json_atomic(out_dir / "validation.json", summary)
    write_text_atomic(out_dir / "report.html", render_report(summary))
    if failures:
        shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
        raise GateFailed(f"data quality failed ({len(failures)} checks, report {out_dir / 'report.html'}): {shown}")
    return {
        "success": True,
        "report": str(out_dir / "report.html"),
        "validation": str(out_dir / "validation.json"),
        "tables": {
            name: {
                "rows": t["rows"],
                "expectations": len(t["expectations"]),
                "max_psi": max((d["psi"] for d in t["drift"].values()), default=None),
            }
            for name, t in tables.items()
        },
    }
