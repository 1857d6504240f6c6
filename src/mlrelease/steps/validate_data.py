"""Step `validate-data`: every source partition the run will serve or train on passes before anything reads it.

Runs first in the DAG's data half, on the sources themselves: nothing is in the online store, the
training set or a later reference window until its partition passed, and materialize and train read only
partitions the ledger approved with the same SHA-256 (so a failed gate leaves the online store as it was).

Per table and partition: the physical contract (columns, arrow types, UTC-aware event times), then the
table's Great Expectations suite (`config/gx/`) on the partition's rows of this run, with bounds derived
from the table's own history as the suite declares, then PSI drift of each key feature per partition and
over the run's interval. Rows of a partition outside the run (after the interval end) are counted, never
dropped silently. The GX Data Docs site is the report.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import date, timedelta
from typing import Any, Protocol

from mlrelease.data.schema import TABLES, Table
from mlrelease.errors import GateFailed, StepError
from mlrelease.model.training_data import training_window
from mlrelease.quality.drift import DEFAULT_PSI_THRESHOLD
from mlrelease.quality.findings import entries, failure_line
from mlrelease.quality.gx_project import GxProject
from mlrelease.quality.hourly import gaps_from_counts
from mlrelease.quality.ledger import PartitionFile, ledger
from mlrelease.quality.pandas_tables import PandasTableCheck
from mlrelease.quality.parameters import parameters_from
from mlrelease.quality.partitions import Slice, run_slices
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.sources import partition_file
from mlrelease.spark.session import data_engine
from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import Window, run_key

MIN_REFERENCE_COVERAGE = 0.5  # a reference with less than half its days present is too thin to compare against
# PSI over fewer rows is mostly sampling noise (about bins/n): smaller slices are judged in the interval-wide PSI.
MIN_DRIFT_ROWS = 500
GX_PROJECT = REPO_ROOT / "config" / "gx"
# Expectations that still mean something on an empty batch (aggregates are undefined there).
ROW_WISE_OR_COUNT = {"expect_table_row_count_to_be_between", "expect_table_columns_to_match_set"}
# Referenced tables first: orders' foreign keys are checked against their keys.
ORDER = ("users", "packages", "routes", "orders")


def _scope_days(table: Table, settings: Settings, load: Window, training: Window | None) -> list[date]:
    """The load window's days, plus training days whose partition never passed or changed since it did."""
    days = set(load.days())
    if training is not None:
        book = ledger(settings.home)
        approved = book.read()
        for day in training.days():
            pf = PartitionFile(table.name, day, partition_file(settings.offline_dir / table.name, day))
            if pf.path.is_file() and not book.is_approved(pf, approved):
                days.add(day)
    return sorted(days)


class TableCheck(Protocol):
    """What validate-data asks of one table on an engine (quality/pandas_tables.py, quality/spark_tables.py)."""

    table: Table
    slices: list[Slice]
    reference_days: list[date]
    contract: dict[date, list[tuple[str, str]]]

    def sha256(self, day: date) -> str: ...
    def rows_in_file(self, day: date) -> int: ...
    def slice_data(self, piece: Slice, known: dict[str, Any]) -> Any: ...
    def interval_drift(self, window: Window, reference: Window, threshold: float) -> dict[str, Any]: ...
    def changed_since_read(self) -> list[str]: ...


def _table_checks(settings: Settings, engine: str) -> Any:
    """The engine's TableCheck constructor (the Spark one bound to a session on the configured master)."""
    if engine == "pandas":
        return PandasTableCheck
    from mlrelease.quality.spark_tables import SparkTableCheck
    from mlrelease.spark.session import spark_session

    session = spark_session(settings, "validate-data")
    return lambda *args: SparkTableCheck(session, *args)


def _check_slice(
    check: TableCheck, piece: Slice, project: GxProject, known: dict[str, Any], key: str, threshold: float
) -> dict[str, Any]:
    """Contract, suite, drift and per-hour completeness of one partition's rows of this run."""
    table, pf = check.table, piece.partition
    label = f"date={pf.day.isoformat()}"
    report: dict[str, Any] = {
        "sha256": check.sha256(pf.day),
        "rows_in_file": check.rows_in_file(pf.day),
        "expectations": [],
        "drift": {},
    }
    problems = check.contract[pf.day]
    if problems:
        report["failures"] = [f"{table.name}.{col} {label}: {text}" for col, text in problems]
        report["success"] = False
        return report
    data = check.slice_data(piece, known)
    report["outside_run_rows"] = data.outside_run_rows  # for earlier or later runs: counted, not checked
    parameters = parameters_from(project.suite(table.name), data.rows, data.reference, data.counts)
    result = project.validate(table.name, data.batch, parameters, run_name=f"{key} {table.name} {label}")
    report["rows"] = data.rows
    report["expectations"] = entries(result)
    report["parameters"] = parameters
    if data.rows >= MIN_DRIFT_ROWS and not data.reference.empty:
        report["drift"] = data.drift(threshold)
    # The run's rows of the day, hour by hour; event tables only: a snapshot table's rows are a few batches at
    # scheduled times, and one landing an hour late is not a lost hour (its row count is judged per slice).
    gaps = gaps_from_counts(*data.hour_counts()) if table.unique_key else []
    report["hour_gaps"] = [asdict(g) for g in gaps]
    # An empty batch has no spread or mean: its row-count finding says all there is to say.
    report["failures"] = [
        failure_line(table.name, label, e)
        for e in report["expectations"]
        if not e["success"] and (data.rows or e["type"] in ROW_WISE_OR_COUNT)
    ]
    report["failures"] += [
        f"{table.name}.{col} {label}: drift PSI {d['psi']:.3f} > {d['threshold']} against the same hours of "
        f"{len(data.counts)} reference days ({d['rows']} rows)"
        for col, d in report["drift"].items()
        if not d["ok"]
    ]
    report["failures"] += [g.line(table.name, label, len(data.counts)) for g in gaps]
    report["success"] = not report["failures"]
    return report


def validate_data(
    settings: Settings,
    window: Window,
    *,
    overlap: timedelta = timedelta(0),
    training_days: int = 0,
    reference_days: int = 7,
    psi_threshold: float = DEFAULT_PSI_THRESHOLD,
) -> dict[str, Any]:
    """Validate every partition the run will load or train on; approve them in the ledger or fail naming each."""
    load = window.widened(overlap)
    training = training_window(window, training_days) if training_days > 0 else None
    scope = Window(min(load.start, training.start) if training else load.start, window.end)
    first = load.start.date()
    ref_days = [first - timedelta(days=i) for i in range(reference_days, 0, -1)]
    key = run_key(window.end)
    out_dir = settings.artifacts_dir / key / "data_quality"
    engine = data_engine(settings)
    table_check = _table_checks(settings, engine)
    checks: dict[str, TableCheck] = {}
    for name in ORDER:
        table = TABLES[name]
        slices = run_slices(settings.offline_dir / name, name, _scope_days(table, settings, load, training), scope)
        checks[name] = check = table_check(table, settings, slices, ref_days)
        if reference_days and len(check.reference_days) < MIN_REFERENCE_COVERAGE * reference_days:
            raise StepError(
                f"no reference data for {name}: only {len(check.reference_days)} of the {reference_days} days "
                f"before {first} have clean partitions to compare against; load history first or pass "
                "--reference-days 0 to validate without history"
            )

    project = GxProject(GX_PROJECT, out_dir / "gx_project", engine)
    partitions: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    failures: list[str] = []
    reference = Window(window.start - timedelta(days=reference_days), window.start) if reference_days else None
    for name, check in checks.items():
        for piece in check.slices:
            report = _check_slice(check, piece, project, checks, key, psi_threshold)
            partitions[piece.partition.name] = {
                "start": piece.start.isoformat(),
                "end": piece.end.isoformat(),
                **report,
            }
            failures += report["failures"]
        interval = check.interval_drift(window, reference, psi_threshold) if reference else {}
        failures += [
            f"{name}.{col} interval: drift PSI {d['psi']:.3f} > {d['threshold']} over [{window.start}, {window.end})"
            for col, d in interval.items()
            if not d["ok"]
        ]
        mine = [partitions[s.partition.name] for s in check.slices]
        tables[name] = {
            "rows": sum(p.get("rows", 0) for p in mine),
            "outside_run_rows": sum(p.get("outside_run_rows", 0) for p in mine),
            "partitions": [s.partition.name for s in check.slices],
            "success": all(p["success"] for p in mine) and all(d["ok"] for d in interval.values()),
            "expectations": [
                {**e, "column": f"{e['column'] or 'table'}@{s.partition.day}"}
                for s, p in zip(check.slices, mine, strict=True)
                for e in p["expectations"]
            ],
            "drift": {
                **interval,
                **{
                    f"{c}@{s.partition.day}": d
                    for s, p in zip(check.slices, mine, strict=True)
                    for c, d in p["drift"].items()
                },
            },
        }
    docs = project.build_docs()
    summary = {
        "success": not failures,
        "engine": engine,
        "window": {"start": window.start.isoformat(), "end": window.end.isoformat()},
        "load_window": {"start": load.start.isoformat(), "end": load.end.isoformat()},
        "reference_days": [d.isoformat() for d in ref_days],
        "data_docs": str(docs),
        "tables": tables,
        "partitions": partitions,
        "failures": failures,
    }
    validated = [s.partition for c in checks.values() for s in c.slices]
    book = ledger(settings.home)
    changed = [name for c in checks.values() for name in c.changed_since_read()]
    if changed:  # the engine read other bytes than the digest names: approve nothing, a retry checks them again
        book.revoke(validated)
        raise StepError(f"source partitions changed while they were validated: {', '.join(changed)}; rerun the step")
    write_json_atomic(out_dir / "validation.json", summary)
    if failures:
        book.revoke(validated)
        shown = "; ".join(failures[:4]) + (f"; and {len(failures) - 4} more" if len(failures) > 4 else "")
        raise GateFailed(f"data quality failed ({len(failures)} findings, Data Docs {docs}): {shown}")
    book.approve(validated, {p: partitions[p]["sha256"] for p in partitions}, key)
    return {
        "success": True,
        "engine": engine,
        "data_docs": str(docs),
        "validation": str(out_dir / "validation.json"),
        "partitions": sorted(partitions),
        "tables": {
            name: {
                "rows": t["rows"],
                "outside_run_rows": t["outside_run_rows"],
                "expectations": len(t["expectations"]),
                "max_psi": max((d["psi"] for d in t["drift"].values()), default=None),
            }
            for name, t in tables.items()
        },
    }
