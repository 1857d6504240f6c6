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
from typing import Any

import numpy as np
import pandas as pd

from mlrelease.data.schema import TABLES, Table
from mlrelease.errors import GateFailed, StepError
from mlrelease.model.training_data import training_window
from mlrelease.quality.contract import contract_problems
from mlrelease.quality.derived import (
    REFERENCES,
    TEMPORAL_REFERENCES,
    History,
    content_hashes,
    first_seen,
    key_hashes,
    row_hashes,
    with_derived_columns,
)
from mlrelease.quality.drift import DEFAULT_PSI_THRESHOLD, psi
from mlrelease.quality.findings import entries, failure_line
from mlrelease.quality.gx_project import GxProject
from mlrelease.quality.hourly import hour_gaps
from mlrelease.quality.ledger import PartitionFile, ledger
from mlrelease.quality.parameters import suite_parameters
from mlrelease.quality.partitions import LoadedPartition, Slice, read_partition, rows_between, run_slices, same_hours
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.sources import partition_file
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


class TableCheck:
    """Everything validate-data reads of one table: its run slices, the reference days, earlier keys."""

    def __init__(self, table: Table, settings: Settings, slices: list[Slice], reference_days: list[date]) -> None:
        self.table = table
        self.slices = slices
        wanted = sorted({*reference_days, *(s.partition.day for s in slices)})
        self.loaded: dict[date, LoadedPartition] = {}
        for day in wanted:
            path = partition_file(settings.offline_dir / table.name, day)
            if path.is_file():
                self.loaded[day] = read_partition(PartitionFile(table.name, day, path), table.timestamp)
        self.contract = {day: contract_problems(table, lp.schema) for day, lp in self.loaded.items()}
        # A day in scope may be another day's reference (a first run checks a week of history at once); a
        # slice is never compared with itself (see `reference`).
        self.reference_days = [d for d in reference_days if d in self.loaded and not self.contract[d]]
        self._hashes: dict[date, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def hashes(self, day: date) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Key, row and (event tables) content hashes of one loaded, contract-clean partition (cached)."""
        if day not in self._hashes:
            table, frame = self.table, self.loaded[day].frame
            content = content_hashes(table, frame) if table.unique_key else None
            self._hashes[day] = (key_hashes(table, frame), row_hashes(table, frame), content)
        return self._hashes[day]

    def earlier(self, day: date) -> History:
        """Key, row and content hashes of every clean loaded partition before `day`."""
        days = [d for d in self.loaded if d < day and not self.contract[d]]
        triples = [self.hashes(d) for d in days]
        return History(
            keys=[k for k, _, _ in triples],
            rows=[r for _, r, _ in triples],
            contents=[c for _, _, c in triples if c is not None],
        )

    def _clean_until(self, day: date) -> list[pd.DataFrame]:
        return [lp.frame for d, lp in self.loaded.items() if d <= day and not self.contract[d]]

    def keys_until(self, day: date) -> np.ndarray:
        """Every key this table published up to and including `day` (what a foreign key may point at)."""
        keys = [frame[self.table.key].to_numpy() for frame in self._clean_until(day)]
        return np.concatenate(keys) if keys else np.array([], dtype="int64")

    def since_until(self, day: date) -> pd.Series:
        """Each key's first event time over the partitions up to and including `day`."""
        return first_seen(self.table, self._clean_until(day))

    def reference(self, hours: tuple[float, float], day: date) -> tuple[pd.DataFrame, list[int]]:
        """The other reference days' rows over the same hours of the day, pooled, and each day's count."""
        days = [d for d in self.reference_days if d != day]
        frames = [same_hours(self.loaded[d].frame, self.table.timestamp, d, hours) for d in days]
        pooled = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return pooled, [len(f) for f in frames]


def _drift(table: Table, current: pd.DataFrame, reference: pd.DataFrame, threshold: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in table.drift_columns:
        try:
            value = psi(
                pd.to_numeric(reference[column], errors="coerce").to_numpy(),
                pd.to_numeric(current[column], errors="coerce").to_numpy(),
            )
        except ValueError:
            value = float("inf")
        out[column] = {"psi": value, "threshold": threshold, "ok": value <= threshold, "rows": len(current)}
    return out


def _check_slice(
    check: TableCheck, piece: Slice, project: GxProject, known: dict[str, TableCheck], key: str, threshold: float
) -> dict[str, Any]:
    """Contract, suite and drift of one partition's rows of this run."""
    table, pf = check.table, piece.partition
    label = f"date={pf.day.isoformat()}"
    loaded = check.loaded[pf.day]
    report: dict[str, Any] = {
        "sha256": loaded.sha256,
        "rows_in_file": len(loaded.frame),
        "expectations": [],
        "drift": {},
    }
    problems = check.contract[pf.day]
    if problems:
        report["failures"] = [f"{table.name}.{col} {label}: {text}" for col, text in problems]
        report["success"] = False
        return report
    frame = loaded.frame
    begin = pd.Timestamp(pf.day, tz="UTC")
    in_day = rows_between(frame, table.timestamp, begin, begin + pd.Timedelta(days=1))
    in_run = rows_between(frame, table.timestamp, piece.start, piece.end)
    # Misfiled rows (outside the partition's day) stay in the batch so the suite sees and names them.
    batch_rows = frame[in_run | ~in_day]
    report["outside_run_rows"] = int((in_day & ~in_run).sum())  # for earlier or later runs: counted, not checked
    history = check.earlier(pf.day)
    if table.name == "orders":
        history.known_keys = {ref: known[ref].keys_until(pf.day) for ref in REFERENCES.values()}
        temporal = [REFERENCES[column] for column in TEMPORAL_REFERENCES]
        history.since = {ref: known[ref].since_until(pf.day) for ref in temporal}
    batch = with_derived_columns(table, batch_rows.reset_index(drop=True), pf.day, history)
    reference, counts = check.reference(piece.hours, pf.day)
    parameters = suite_parameters(project.suite(table.name), batch, reference, counts)
    result = project.validate(table.name, batch, parameters, run_name=f"{key} {table.name} {label}")
    report["rows"] = len(batch)
    report["expectations"] = entries(result)
    report["parameters"] = parameters
    if len(batch) >= MIN_DRIFT_ROWS and not reference.empty:
        report["drift"] = _drift(table, batch, reference, threshold)
    gaps = hour_gaps(table, frame[in_run], reference)  # the run's rows of the day, hour by hour
    report["hour_gaps"] = [asdict(g) for g in gaps]
    # An empty batch has no spread or mean: its row-count finding says all there is to say.
    report["failures"] = [
        failure_line(table.name, label, e)
        for e in report["expectations"]
        if not e["success"] and (len(batch) or e["type"] in ROW_WISE_OR_COUNT)
    ]
    report["failures"] += [
        f"{table.name}.{col} {label}: drift PSI {d['psi']:.3f} > {d['threshold']} against the same hours of "
        f"{len(counts)} reference days ({d['rows']} rows)"
        for col, d in report["drift"].items()
        if not d["ok"]
    ]
    report["failures"] += [g.line(table.name, label, len(counts)) for g in gaps]
    report["success"] = not report["failures"]
    return report


def _interval_drift(check: TableCheck, window: Window, reference: Window, threshold: float) -> dict[str, Any]:
    """PSI of the run's whole interval against the reference window (same hours of the day, larger samples)."""
    ts = check.table.timestamp

    def rows(days: list[date], span: Window) -> pd.DataFrame:
        frames = [check.loaded[d].frame for d in days if d in check.loaded and not check.contract[d]]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[ts])
        return frame[rows_between(frame, ts, span.start, span.end)] if len(frame) else frame

    current = rows([s.partition.day for s in check.slices], window)
    past = rows(check.reference_days, reference)
    if current.empty or past.empty:
        return {}
    return _drift(check.table, current, past, threshold)


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
    checks: dict[str, TableCheck] = {}
    for name in ORDER:
        table = TABLES[name]
        slices = run_slices(settings.offline_dir / name, name, _scope_days(table, settings, load, training), scope)
        checks[name] = check = TableCheck(table, settings, slices, ref_days)
        if reference_days and len(check.reference_days) < MIN_REFERENCE_COVERAGE * reference_days:
            raise StepError(
                f"no reference data for {name}: only {len(check.reference_days)} of the {reference_days} days "
                f"before {first} have clean partitions to compare against; load history first or pass "
                "--reference-days 0 to validate without history"
            )

    project = GxProject(GX_PROJECT, out_dir / "gx_project")
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
        interval = _interval_drift(check, window, reference, psi_threshold) if reference else {}
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
        "window": {"start": window.start.isoformat(), "end": window.end.isoformat()},
        "load_window": {"start": load.start.isoformat(), "end": load.end.isoformat()},
        "reference_days": [d.isoformat() for d in ref_days],
        "data_docs": str(docs),
        "tables": tables,
        "partitions": partitions,
        "failures": failures,
    }
    write_json_atomic(out_dir / "validation.json", summary)
    validated = [s.partition for c in checks.values() for s in c.slices]
    book = ledger(settings.home)
    if failures:
        book.revoke(validated)
        shown = "; ".join(failures[:4]) + (f"; and {len(failures) - 4} more" if len(failures) > 4 else "")
        raise GateFailed(f"data quality failed ({len(failures)} findings, Data Docs {docs}): {shown}")
    book.approve(validated, {p: partitions[p]["sha256"] for p in partitions}, key)
    return {
        "success": True,
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
