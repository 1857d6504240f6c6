"""Step `materialize`: load exactly one window of the offline sources into the online store."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from mlrelease.errors import StepError
from mlrelease.feast_store import open_store
from mlrelease.quality.ledger import PartitionFile, ledger
from mlrelease.settings import Settings
from mlrelease.sources import read_schema, read_window, window_partitions
from mlrelease.spark.session import start_engine
from mlrelease.timewindow import Window
from mlrelease.watermarks import WatermarkStore

# Feast primitive type name -> predicate on the arrow type found in the source files.
_ARROW_CHECKS = {
    "Int64": pa.types.is_integer,
    "Int32": pa.types.is_integer,
    "Float64": pa.types.is_floating,
    "Float32": pa.types.is_floating,
    "String": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "Bool": pa.types.is_boolean,
}


@dataclass(frozen=True)
class ViewScan:
    """What one feature view's source holds for the window: rows, distinct entities, newest event."""

    view: str
    rows: int
    entities: int
    newest_event: Any


def source_schema_problems(view: Any, schema: pa.Schema) -> list[str]:
    """Columns the feature view needs that the source lacks or holds with an incompatible type."""
    problems = []
    needed = {f.name: str(f.dtype) for f in view.schema if f.name not in view.join_keys}
    for key in view.join_keys:
        needed.setdefault(key, "Int64")
    needed[view.batch_source.timestamp_field] = "timestamp"
    for column, feast_type in needed.items():
        if column not in schema.names:
            problems.append(f"missing column {column}")
            continue
        arrow_type = schema.field(column).type
        check = pa.types.is_timestamp if feast_type == "timestamp" else _ARROW_CHECKS.get(feast_type)
        if check is not None and not check(arrow_type):
            problems.append(f"column {column} has type {arrow_type}, expected {feast_type}")
    return problems


def source_partitions(view: Any, window: Window) -> list[PartitionFile]:
    """The source partitions of one feature view that a window reads (a missing one is an error naming it)."""
    table_dir = Path(view.batch_source.path)
    paths = window_partitions(table_dir, window)
    return [PartitionFile(table_dir.name, day, path) for day, path in zip(window.days(), paths, strict=True)]


def check_sources(views: list[Any], window: Window) -> None:
    """Every partition of every view's source must exist, be readable and match the view; report all mismatches."""
    mismatches = []
    for view in views:
        for path in window_partitions(Path(view.batch_source.path), window):
            problems = source_schema_problems(view, read_schema(path))
            if problems:
                mismatches.append(f"{view.name} ({path}): {'; '.join(problems)}")
    if mismatches:
        raise StepError("sources do not match their feature views: " + " | ".join(mismatches))


def scan_view(view: Any, window: Window) -> ViewScan:
    """Measure what materialize will load for one view: rows, distinct entities, newest event."""
    table_dir = Path(view.batch_source.path)
    ts_field = view.batch_source.timestamp_field
    frame = read_window(table_dir, window, columns=[*view.join_keys, ts_field])
    newest = frame[ts_field].max() if len(frame) else None
    return ViewScan(view.name, len(frame), int(frame.drop_duplicates(view.join_keys).shape[0]), newest)


def materialize(settings: Settings, window: Window, overlap: timedelta) -> dict[str, Any]:
    """Materialize [start - overlap, end) for every feature view; rerunning the same window is a no-op upsert."""
    began = time.perf_counter()
    # Spark: the session on the configured master, before Feast would build its own
    start_engine(settings, "materialize")
    store = open_store(settings)
    views = [v for v in store.list_feature_views() if v.online]
    if not views:
        raise StepError("no online feature views are registered: run the apply-features step first")
    load_window = window.widened(overlap)
    # Only partitions that passed validate-data, byte for byte: a failed or skipped gate never reaches the store.
    ledger(settings.home).require([p for view in views for p in source_partitions(view, load_window)], "materialize")
    check_sources(views, load_window)
    scans = [scan_view(view, load_window) for view in views]
    if sum(s.rows for s in scans) == 0:
        raise StepError(
            f"empty window: no source rows in [{load_window.start}, {load_window.end}) for any feature view"
        )

    per_view: dict[str, dict[str, Any]] = {}
    for view, scan in zip(views, scans, strict=True):
        started = time.perf_counter()
        try:
            store.materialize(load_window.start, load_window.end, feature_views=[view.name])
        except Exception as exc:
            raise StepError(f"materializing {view.name} failed: {type(exc).__name__}: {exc}") from None
        per_view[view.name] = {
            "source_rows": scan.rows,
            "rows_written": scan.entities,
            "newest_event": scan.newest_event.isoformat() if scan.newest_event is not None else None,
            "duration_s": round(time.perf_counter() - started, 3),
        }
    watermarks = WatermarkStore(settings.home / "state" / "feast_watermarks.json")
    watermarks.advance({s.view: s.newest_event.to_pydatetime() for s in scans if s.newest_event is not None})
    return {
        "window": {"start": window.start.isoformat(), "end": window.end.isoformat()},
        "loaded_from": load_window.start.isoformat(),
        "overlap_s": overlap.total_seconds(),
        "online_store": settings.online_store,
        "views": per_view,
        "rows_written": sum(v["rows_written"] for v in per_view.values()),
        "duration_s": round(time.perf_counter() - began, 3),
    }
