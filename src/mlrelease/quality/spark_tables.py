"""The Spark engine of validate-data: the same questions as quality/pandas_tables.py, answered on a cluster.

Partitions are read by the executors (`spark.read.parquet`), never collected: a slice's batch gets its `_…`
columns from joins on 64-bit row hashes (xxhash64) and key joins, the suite's history rules read aggregates,
PSI bins come from exact percentiles, and GX validates the Spark DataFrame itself. Only small results reach
the driver. The ledger's digest is of the file Spark read, taken before the read and checked again after the
run (`changed_since_read`), so an approval always names the bytes that were checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlrelease.data.schema import Table
from mlrelease.errors import StepError
from mlrelease.quality.contract import contract_problems
from mlrelease.quality.derived import REFERENCES, TEMPORAL_REFERENCES
from mlrelease.quality.drift import edge_ranks, edges_from_order_statistics, psi_from_counts
from mlrelease.quality.hourly import BINS, judged_columns
from mlrelease.quality.partitions import Slice, day_start
from mlrelease.settings import Settings
from mlrelease.sources import partition_file
from mlrelease.storage import sha256
from mlrelease.timewindow import Window

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ROW = "_row"  # the row's position in its file: batches keep the file's order, as the pandas engine does
PSI_BINS = 10


def _between(ts: Column, start: Any, end: Any) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce((ts >= F.lit(start)) & (ts < F.lit(end)), F.lit(False))  # a null time is in no window


def _hashed(columns: list[str]) -> Column:
    """A 64-bit hash of the row's values in `columns` (nulls included), the pandas engine's uint64 hashes' twin."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[F.col(c) for c in columns])


def _union(frames: list[DataFrame]) -> DataFrame | None:
    return reduce(lambda a, b: a.unionByName(b), frames) if frames else None


def _merge_joined(history: DataFrame) -> DataFrame:
    """A join side built from earlier partitions, joined by sort-merge (sorted runs spill to disk), never by a hash
    table in memory.

    Its size estimate comes from a column or two of compressed parquet and reads small, so Spark would broadcast
    it, or (with the shuffle coalesced) build one hash table of every earlier key in one task: at 1M orders a day
    the 1 GB driver could not build the broadcast table, nor a 1 GB executor the hash table
    (bench/bench_data_engines.py found both).
    """
    return history.hint("merge")


def _flag_unseen(batch: DataFrame, hashed: str, seen: DataFrame | None, flag: str) -> DataFrame:
    """`flag` is True where the batch's column `hashed` (a row hash, or a key) is not among `seen`'s single column."""
    from pyspark.sql import functions as F

    if seen is None:
        return batch.withColumn(flag, F.lit(True))
    known = seen.toDF("_seen").distinct().withColumn("_hit", F.lit(True))
    joined = batch.join(_merge_joined(known), batch[hashed] == known["_seen"], "left")
    return joined.withColumn(flag, F.col("_hit").isNull()).drop("_seen", "_hit")


def _schema(table: str, day: date, path: Path) -> pa.Schema:
    """The partition's parquet schema; an unreadable file is the pandas engine's error, naming it (exit 2)."""
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise StepError(f"{table}/date={day}: partition is unreadable ({path}): {exc}") from None


def spark_problems(schema: pa.Schema) -> list[tuple[str, str]]:
    """What Spark cannot read although the contract allows it: nanosecond timestamps (Spark stops at micros)."""
    return [
        (f.name, f"type {f.type} has nanoseconds, which Spark cannot read; write timestamp[us] (as Spark and Hive do)")
        for f in schema
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns"
    ]


class SparkStats:
    """ReferenceStats of a Spark DataFrame: every column's aggregates in one job, on first use."""

    def __init__(self, frame: DataFrame | None) -> None:
        self.frame = frame
        self._numeric: dict[str, tuple[int, float, float]] | None = None
        self._distinct: dict[str, int] | None = None

    @property
    def empty(self) -> bool:
        """No reference rows at all."""
        return self.frame is None or self._all_numeric()["__rows__"][0] == 0

    def _all_numeric(self) -> dict[str, tuple[int, float, float]]:
        from pyspark.sql import functions as F
        from pyspark.sql.types import NumericType

        if self._numeric is None:
            assert self.frame is not None
            columns = [f.name for f in self.frame.schema if isinstance(f.dataType, NumericType)]
            aggregates = [F.count(F.lit(1))]
            for c in columns:
                value = F.col(c).cast("double")
                aggregates += [F.count(value), F.mean(value), F.stddev_samp(value)]
            row = self.frame.agg(*aggregates).first()
            assert row is not None
            nan = float("nan")
            self._numeric = {"__rows__": (int(row[0]), nan, nan)}
            for i, c in enumerate(columns):
                count, mean, stdev = row[1 + 3 * i : 4 + 3 * i]
                self._numeric[c] = (int(count), nan if mean is None else mean, nan if stdev is None else stdev)
        return self._numeric

    def numeric(self, column: str) -> tuple[int, float, float]:
        """Count, mean and sample standard deviation of the column's numeric values."""
        return self._all_numeric()[column]

    def distinct(self, column: str) -> int:
        """Distinct non-null values of the column (every non-numeric column counted in the same job)."""
        from pyspark.sql import functions as F

        if self._distinct is None:
            assert self.frame is not None
            columns = [f.name for f in self.frame.schema if not f.name.startswith("_")]
            row = self.frame.agg(*[F.countDistinct(c) for c in columns]).first()
            assert row is not None
            self._distinct = {c: int(v) for c, v in zip(columns, row, strict=True)}
        return self._distinct[column]


def spark_psi(reference: DataFrame, current: DataFrame, column: str) -> float:
    """PSI of one column, as drift.psi computes it (numpy's quantile edges), with every count done by Spark."""
    from pyspark.sql import functions as F

    def finite(frame: DataFrame) -> DataFrame:
        value = F.col(column).cast("double")
        return frame.select(value.alias("v")).where(F.col("v").isNotNull() & ~F.isnan("v") & (F.abs("v") < np.inf))

    ref, cur = finite(reference), finite(current)
    n = ref.count()
    if n == 0 or cur.isEmpty():
        return float("inf")  # an empty sample: as drift.psi's ValueError, judged a full shift
    edges = edges_from_order_statistics(n, order_statistics(ref, "v", edge_ranks(n, PSI_BINS)), PSI_BINS)
    if edges.size < 2:  # a constant reference: any other value is a full shift
        return 0.0 if cur.where(F.col("v") != float(edges[0])).isEmpty() else float("inf")
    inner = [float(e) for e in edges[1:-1]]

    def counts(frame: DataFrame) -> np.ndarray:
        bucket = reduce(lambda acc, e: acc + (F.col("v") >= e).cast("int"), inner, F.lit(0))
        found = {r[0]: r[1] for r in frame.groupBy(bucket.alias("b")).count().collect()}
        return np.array([found.get(i, 0) for i in range(len(inner) + 1)], dtype="float64")

    return psi_from_counts(counts(ref), counts(cur))


def order_statistics(frame: DataFrame, column: str, ranks: list[int]) -> dict[int, float]:
    """The values at these 0-based ranks of the column sorted ascending: distinct values with their counts, a
    running count over them (one task holds the distinct values, as Spark's exact `percentile` does), and only the
    blocks that hold a wanted rank reach the driver."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    running = Window.orderBy(column).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    blocks = frame.groupBy(column).count().withColumn("_end", F.sum("count").over(running))
    start = F.col("_end") - F.col("count")  # the block of equal values holds ranks [start, end)
    wanted = reduce(
        lambda acc, r: acc | ((start <= r) & (F.col("_end") > r)),
        ranks[1:],
        (start <= ranks[0]) & (F.col("_end") > ranks[0]),
    )
    found: dict[int, float] = {}
    for row in blocks.where(wanted).select(column, start.alias("s"), "_end").collect():
        found.update({r: float(row[column]) for r in ranks if row["s"] <= r < row["_end"]})
    return found


def hour_counts(frame: DataFrame, timestamp: str, columns: list[str]) -> np.ndarray:
    """Rows and non-null values of each column per half hour of the day (UTC session): BINS x (1 + columns)."""
    from pyspark.sql import functions as F

    aggregates = [F.count(F.lit(1)), *(F.count(F.col(c)) for c in columns)]
    out = np.zeros((BINS, 1 + len(columns)), dtype="int64")
    half_hour = F.hour(timestamp) * 2 + F.floor(F.minute(timestamp) / 30)
    for row in frame.groupBy(half_hour.cast("int").alias("b")).agg(*aggregates).collect():
        if row["b"] is not None:
            out[row["b"]] = list(row)[1:]
    return out


@dataclass
class SparkSlice:
    """One slice's batch (with its `_…` columns) and its reference, as Spark DataFrames."""

    table: Table
    batch: DataFrame
    in_run: DataFrame
    reference_rows: DataFrame | None
    counts: list[int]
    outside_run_rows: int
    rows: int

    def __post_init__(self) -> None:
        self.reference = SparkStats(self.reference_rows)

    def drift(self, threshold: float) -> dict[str, Any]:
        """PSI per drift column of this batch against the same hours of the reference days."""
        assert self.reference_rows is not None
        return _drift(self.table, self.batch, self.rows, self.reference_rows, threshold)

    def hour_counts(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The judged columns and the per-hour counts of this slice and of its reference."""
        columns = judged_columns(self.table, self.in_run.columns)
        if self.reference.empty:
            empty = np.zeros((24, 1), dtype="int64")
            return [], empty, empty
        assert self.reference_rows is not None
        ts = self.table.timestamp
        return columns, hour_counts(self.in_run, ts, columns), hour_counts(self.reference_rows, ts, columns)


def _drift(table: Table, current: DataFrame, rows: int, reference: DataFrame, threshold: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in table.drift_columns:
        value = spark_psi(reference, current, column)
        out[column] = {"psi": value, "threshold": threshold, "ok": value <= threshold, "rows": rows}
    return out


class SparkTableCheck:
    """Everything validate-data reads of one table, on the cluster: slices, reference days, earlier keys."""

    def __init__(
        self, session: SparkSession, table: Table, settings: Settings, slices: list[Slice], reference_days: list[date]
    ) -> None:
        from pyspark.sql import functions as F

        self.session, self.table, self.slices = session, table, slices
        wanted = sorted({*reference_days, *(s.partition.day for s in slices)})
        self.paths = {d: partition_file(settings.offline_dir / table.name, d) for d in wanted}
        self.paths = {d: p for d, p in self.paths.items() if p.is_file()}
        # Digest and schema before Spark reads a byte; `changed_since_read` compares the digest afterwards.
        self.digests = {d: sha256(p) for d, p in self.paths.items()}
        schemas = {d: _schema(table.name, d, p) for d, p in self.paths.items()}
        self.contract = {d: contract_problems(table, sc) or spark_problems(sc) for d, sc in schemas.items()}
        self.frames: dict[date, DataFrame] = {
            d: session.read.parquet(str(p)).withColumn(ROW, F.monotonically_increasing_id())
            for d, p in self.paths.items()
            if not self.contract[d]
        }
        self.reference_days = [d for d in reference_days if d in self.frames]

    def sha256(self, day: date) -> str:
        """The digest of the day's partition file, taken before Spark read it."""
        return self.digests[day]

    def rows_in_file(self, day: date) -> int:
        """Rows of the day's partition file (its parquet footer)."""
        return int(pq.read_metadata(self.paths[day]).num_rows)

    def changed_since_read(self) -> list[str]:
        """Partitions whose file no longer has the digest taken before Spark read it."""
        return [f"{self.table.name}/date={d}" for d, p in self.paths.items() if sha256(p) != self.digests[d]]

    def _clean(self, days: list[date]) -> list[DataFrame]:
        return [self.frames[d] for d in days if d in self.frames]

    def _before(self, day: date) -> list[DataFrame]:
        return self._clean([d for d in self.frames if d < day])

    def _until(self, day: date) -> list[DataFrame]:
        return self._clean([d for d in self.frames if d <= day])

    def keys_until(self, day: date) -> DataFrame | None:
        """Every key this table published up to and including `day` (one column, the key)."""
        return _union([f.select(self.table.key) for f in self._until(day)])

    def since_until(self, day: date) -> DataFrame | None:
        """Each key's first event time over the partitions up to and including `day` (key, `_since`)."""
        from pyspark.sql import functions as F

        frames = _union([f.select(self.table.key, self.table.timestamp) for f in self._until(day)])
        return (
            None if frames is None else frames.groupBy(self.table.key).agg(F.min(self.table.timestamp).alias("_since"))
        )

    def _key_columns(self) -> list[str]:
        return [self.table.key] if self.table.unique_key else [self.table.key, self.table.timestamp]

    def _row_columns(self, frame: DataFrame) -> list[str]:
        return [c for c in frame.columns if c != self.table.timestamp and not c.startswith("_")]

    def _derived(self, batch: DataFrame, day: date, known: dict[str, Any]) -> DataFrame:
        """The batch plus the `_…` columns derived.with_derived_columns adds on the pandas engine."""
        from pyspark.sql import Window as W
        from pyspark.sql import functions as F

        table, earlier = self.table, self._before(day)
        begin = day_start(day)
        out = batch.withColumn("_in_partition_day", _between(F.col(table.timestamp), begin, begin + timedelta(days=1)))
        checks = [("_key_is_new", self._key_columns()), ("_row_is_new", self._row_columns(batch))]
        if table.unique_key:
            checks.append(("_content_is_new", table.content_columns))
        for flag, columns in checks:
            out = out.withColumn(f"{flag}_h", _hashed(columns))
            seen = _union([f.select(_hashed(columns).alias("h")) for f in earlier])
            out = _flag_unseen(out, f"{flag}_h", seen, flag)
        if table.unique_key:  # a copy of a row earlier in this batch (file order) is not new either
            first = F.min(ROW).over(W.partitionBy("_content_is_new_h"))
            out = out.withColumn("_content_is_new", F.col("_content_is_new") & (F.col(ROW) == first))
        out = out.drop(*[f"{flag}_h" for flag, _ in checks])
        if table.name == "orders":
            out = self._references(out, day, known)
        return out

    def _references(self, batch: DataFrame, day: date, known: dict[str, Any]) -> DataFrame:
        from pyspark.sql import functions as F

        out = batch
        for column, referenced in REFERENCES.items():
            keys = known[referenced].keys_until(day)
            flag = f"_{column}_exists"
            if keys is None:
                out = out.withColumn(flag, F.lit(False))
                continue
            out = _flag_unseen(out, column, keys, flag).withColumn(flag, ~F.col(flag))
        for column in TEMPORAL_REFERENCES:
            since = known[REFERENCES[column]].since_until(day)
            flag = f"_{column}_existed_at_event"
            if since is None:
                out = out.withColumn(flag, F.lit(True))
                continue
            since = since.toDF("_ref", "_since")
            out = out.join(_merge_joined(since), out[column] == since["_ref"], "left")
            existed = F.col("_since").isNull() | (F.col("_since") <= F.col(self.table.timestamp))
            out = out.withColumn(flag, F.coalesce(existed, F.lit(False))).drop("_ref", "_since")
        return out

    def reference(self, hours: tuple[float, float], day: date) -> tuple[DataFrame | None, list[int]]:
        """The other reference days' rows over the same hours of the day, pooled, and each day's count."""
        from pyspark.sql import functions as F

        frames = []
        for d in (d for d in self.reference_days if d != day):
            begin = day_start(d)
            span = _between(
                F.col(self.table.timestamp), begin + timedelta(hours=hours[0]), begin + timedelta(hours=hours[1])
            )
            frames.append(self.frames[d].where(span).drop(ROW).withColumn("_day", F.lit(d.isoformat())))
        pooled = _union(frames)
        if pooled is None:
            return None, []
        pooled = pooled.cache()  # read by the rules, the PSI and the per-hour counts
        found = {r["_day"]: r["count"] for r in pooled.groupBy("_day").count().collect()}
        return pooled.drop("_day"), [found.get(d.isoformat(), 0) for d in self.reference_days if d != day]

    def slice_data(self, piece: Slice, known: dict[str, Any]) -> SparkSlice:
        """The slice's batch with its `_…` columns (misfiled rows kept, in file order) and its reference."""
        from pyspark.sql import functions as F

        day, ts = piece.partition.day, F.col(self.table.timestamp)
        frame = self.frames[day]
        begin = day_start(day)
        in_day = _between(ts, begin, begin + timedelta(days=1))
        in_run = _between(ts, piece.start, piece.end)
        batch = self._derived(frame.where(in_run | ~in_day), day, known).orderBy(ROW).drop(ROW).cache()
        reference, counts = self.reference(piece.hours, day)
        outside = frame.where(in_day & ~in_run).count()
        return SparkSlice(self.table, batch, frame.where(in_run).drop(ROW), reference, counts, outside, batch.count())

    def interval_drift(self, window: Window, reference: Window, threshold: float) -> dict[str, Any]:
        """PSI of the run's whole interval against the reference window (same hours of the day, larger samples)."""
        from pyspark.sql import functions as F

        ts = F.col(self.table.timestamp)
        current = _union(self._clean([s.partition.day for s in self.slices]))
        past = _union(self._clean(self.reference_days))
        if current is None or past is None:
            return {}
        current = current.where(_between(ts, window.start, window.end))
        past = past.where(_between(ts, reference.start, reference.end))
        rows = current.count()
        if rows == 0 or past.isEmpty():
            return {}
        return _drift(self.table, current, rows, past, threshold)
