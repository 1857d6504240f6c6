"""The data half on a real local Spark cluster (a standalone master and two workers) against the pandas path.

The same clean history is validated, materialized into a real Redis and turned into a training frame once by
the embedded default (pandas, file offline store) and once with `feature_store.spark.yaml` (GX on Spark
DataFrames, Feast's Spark offline store and `spark.engine`) on the cluster; every finding, row count and
feature value must agree. A night corrupted four ways is stopped with the same lines by both engines.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import GateFailed, StepError
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.spark.cluster import LocalSparkCluster, free_port
from mlrelease.timewindow import Window
from tests.conftest import ROWS_PER_DAY, WINDOW_END, WINDOW_START

pytestmark = pytest.mark.integration
TONIGHT = Window.parse(WINDOW_START, WINDOW_END)
OVERLAP = timedelta(hours=2)
SPARK_YAML = REPO_ROOT / "feature_repo" / "feature_store.spark.yaml"
# The four corruptions the gates learned last, one per day of a three-day training window plus tonight.
CORRUPTED_DAYS = {
    date(2026, 11, 26): "republished_new_ids",
    date(2026, 11, 27): "packages_after_orders",
    date(2026, 11, 28): "feed_outage",
    date(2026, 11, 29): "appended_twice",
}
STOPPED_BY = {
    "republished_new_ids": r"orders\.order_id date=2026-11-26: expected the rows are not copies under new keys",
    "packages_after_orders": r"orders\.package_id date=2026-11-27: expected every order's package has a row at or "
    r"before the order's event time",
    "feed_outage": r"orders\.table date=2026-11-28: expected every hour of the day as complete as the same hour of "
    r"7 reference days; 13:00-14:00 UTC has 0 rows",
    "appended_twice": r"packages\.package_id date=2026-11-29: expected the rows are not copies under new keys .*; "
    r"\d+ of \d+ rows \(50\.0 %\) do not",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSparkCluster]:
    """A standalone master and two workers (one core, 1 GB each), stopped by PID after the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the driver, like the daemons, on loopback
        with LocalSparkCluster(tmp_path_factory.mktemp("spark"), workers=2, cores=1, memory="1g") as running:
            yield running
            from pyspark.sql import SparkSession

            # The driver lives in this test process: stop it before its master goes, or it keeps retrying the
            # master (a third of a core) while the rest of the suite runs on this worker.
            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()


def _home(
    root: Path, clean_offline: Path, mp: pytest.MonkeyPatch, redis_url: str, engine: str, master: str
) -> Settings:
    """An MLRELEASE_HOME with the clean history, on the engine's Feast YAML and the shared Redis (flushed)."""
    import redis

    shutil.copytree(clean_offline, root / "data" / "offline")
    redis.Redis.from_url(f"redis://{redis_url}").flushall()
    mp.setenv("MLRELEASE_HOME", str(root))
    mp.setenv("MLRELEASE_XCOM_PATH", str(root / "xcom" / "return.json"))
    mp.setenv("MLRELEASE_ONLINE_STORE", "redis")
    mp.setenv("MLRELEASE_REDIS_URL", redis_url)
    if engine == "spark":
        mp.setenv("FEAST_FS_YAML_FILE_PATH", str(SPARK_YAML))
        mp.setenv("MLRELEASE_SPARK_MASTER", master)
        mp.setenv("MLRELEASE_FEAST_REGISTRY_URL", f"sqlite:///{root}/feast_registry.db")
    else:
        mp.delenv("FEAST_FS_YAML_FILE_PATH", raising=False)
    mp.chdir(root)
    return Settings.from_env()


def _each_engine(
    root: Path, clean_offline: Path, redis_url: str, cluster: LocalSparkCluster
) -> Iterator[tuple[str, Settings]]:
    """pandas, then Spark on the cluster: each with its own home over the clean history (env set while in use)."""
    for engine in ("pandas", "spark"):
        with pytest.MonkeyPatch.context() as mp:
            yield engine, _home(root / engine, clean_offline, mp, redis_url, engine, cluster.master_url)


def _data_half(settings: Settings) -> dict[str, Any]:
    """apply-features, validate-data, materialize and the training frame, as the nightly DAG chains them."""
    from mlrelease.feast_store import open_store
    from mlrelease.model.training_data import historical_frame
    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.validate_data import validate_data

    apply_features(settings)
    validated = validate_data(settings, TONIGHT, overlap=OVERLAP)
    loaded = materialize(settings, TONIGHT, OVERLAP)
    training = historical_frame(settings, TONIGHT)  # the validated days: train reads nothing else
    orders = pd.read_parquet(settings.offline_dir / "orders" / "date=2026-11-28")
    rows = [
        {"user_id": int(r.user_id), "package_id": int(r.package_id), "route_id": int(r.route_id)}
        for r in orders.tail(40).itertuples()
    ]
    store = open_store(settings)
    online = store.get_online_features(features=store.get_feature_service("parcel_eta_v1"), entity_rows=rows)
    report = json.loads(Path(validated["validation"]).read_text())
    return {"validation": report, "materialized": loaded, "training": training, "online": online.to_df()}


def _same_observed(spark: str, pandas: str) -> bool:
    """The same words and counts; an aggregate printed to 4 digits may differ in its last one (summation order)."""
    numbers = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
    if numbers.sub("#", spark) != numbers.sub("#", pandas):
        return False
    pairs = zip(numbers.findall(spark), numbers.findall(pandas), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-3) for a, b in pairs)


def _same_report(pandas: dict[str, Any], spark: dict[str, Any]) -> None:
    """Every partition's digest, counts, findings and numbers agree (floats to 1e-9: Spark sums in another order)."""
    assert spark["failures"] == pandas["failures"]
    assert spark["partitions"].keys() == pandas["partitions"].keys()
    for name, mine in pandas["partitions"].items():
        theirs = spark["partitions"][name]
        for field in ("sha256", "rows", "rows_in_file", "outside_run_rows", "hour_gaps", "success", "failures"):
            assert theirs.get(field) == mine.get(field), (name, field)
        for key, value in (mine.get("parameters") or {}).items():
            other = theirs["parameters"][key]
            assert (value is None and other is None) or math.isclose(value, other, rel_tol=1e-9), (name, key)
        for column, drift in mine["drift"].items():
            assert theirs["drift"][column]["psi"] == pytest.approx(drift["psi"], rel=1e-9, abs=1e-12), (name, column)
        for ours, other in zip(mine["expectations"], theirs["expectations"], strict=True):
            assert (other["type"], other["column"], other["success"]) == (ours["type"], ours["column"], ours["success"])
            if ours["type"] != "expect_column_values_to_be_in_type_list":  # int64 on pandas is LongType on Spark
                assert _same_observed(other["observed"], ours["observed"]), (name, ours, other)


def test_the_data_half_on_the_cluster_gives_the_pandas_paths_results(
    cluster: LocalSparkCluster, clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    results = {}
    for engine, settings in _each_engine(tmp_path, clean_offline, redis_url, cluster):
        results[engine] = _data_half(settings)
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    assert session is not None and session.sparkContext.master == cluster.master_url
    # The jobs ran on the workers' executors: each worker runs one for this application.
    executors = cluster.executors_of(session.sparkContext.applicationId)
    workers = sorted(w["id"] for w in cluster.alive_workers())
    assert sorted({e.split("/")[0] for e in executors}) == workers and len(executors) == 2
    pandas, spark = results["pandas"], results["spark"]
    assert spark["validation"]["engine"] == "spark" and pandas["validation"]["engine"] == "pandas"
    _same_report(pandas["validation"], spark["validation"])
    assert spark["materialized"]["views"].keys() == pandas["materialized"]["views"].keys()
    for view, loaded in pandas["materialized"]["views"].items():
        assert spark["materialized"]["views"][view]["rows_written"] == loaded["rows_written"] > 0
    assert len(pandas["training"]) > 500
    pd.testing.assert_frame_equal(spark["training"][pandas["training"].columns], pandas["training"], check_dtype=False)
    pd.testing.assert_frame_equal(spark["online"][pandas["online"].columns], pandas["online"], check_dtype=False)


def _corrupt(offline: Path) -> None:
    """Each day of CORRUPTED_DAYS rewritten with its own corruption (all four tables of that day)."""
    for day, mode in CORRUPTED_DAYS.items():
        generate(offline, day, day, rows_per_day=ROWS_PER_DAY, seed=11, inject=mode)


def test_four_corruptions_are_stopped_with_the_same_lines_on_both_engines(
    cluster: LocalSparkCluster, clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.validate_data import validate_data

    findings = {}
    for engine, settings in _each_engine(tmp_path, clean_offline, redis_url, cluster):
        apply_features(settings)
        _corrupt(settings.offline_dir)
        with pytest.raises(GateFailed) as stopped:
            validate_data(settings, TONIGHT, overlap=OVERLAP, training_days=3)
        assert "\n" not in str(stopped.value)
        with pytest.raises(StepError, match="materialize reads only validated source partitions"):
            materialize(settings, TONIGHT, OVERLAP)
        report = settings.artifacts_dir / "20261129T020000Z" / "data_quality" / "validation.json"
        findings[engine] = json.loads(report.read_text())["failures"]
    assert findings["spark"] == findings["pandas"]
    for mode, line in STOPPED_BY.items():
        assert any(re.search(line, f) for f in findings["spark"]), (mode, findings["spark"])


def test_an_unreachable_master_is_named_and_nothing_is_read_or_written(
    clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    from mlrelease.steps.validate_data import validate_data

    url = f"spark://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.MonkeyPatch.context() as mp:
        settings = _home(tmp_path, clean_offline, mp, redis_url, "spark", url)
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        with pytest.raises(StepError, match=re.escape(f"the Spark master {url} cannot be reached")):
            validate_data(settings, TONIGHT, overlap=OVERLAP)
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
