"""The data half on a real local Spark cluster (a standalone master and two workers) against the pandas path.

The nightly DAG runs its data half (apply_features, validate_data, materialize, check_freshness, train) with
`feature_store.spark.yaml` (GX on Spark DataFrames, Feast's Spark offline store and `spark.engine`) on the cluster,
each task a step process with its own Spark application; the same steps run in-process on the embedded default
(pandas, file offline store) over the same history. Every finding, row count, online value and the trained model's
holdout metrics must agree. A night corrupted four ways, with two contract breaks on top, is stopped with the same
lines by both engines and nothing reaches Redis; a missing partition and an unreachable master are named.
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

import numpy as np
import pandas as pd
import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import GateFailed, StepError
from mlrelease.exit_codes import STATUS_SUCCESS
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.spark.cluster import LocalSparkCluster, free_port
from mlrelease.timewindow import Window
from tests.conftest import ROWS_PER_DAY, RUN_KEY, WINDOW_END, WINDOW_START, Receiver, redis_digest, run_nightly_dag

pytestmark = pytest.mark.integration
TONIGHT = Window.parse(WINDOW_START, WINDOW_END)
OVERLAP = timedelta(hours=2)
SPARK_YAML = REPO_ROOT / "feature_repo" / "feature_store.spark.yaml"
# The DAG's data half; Airflow marks every later task (export, serving, benchmark, rollout) successful unrun.
DATA_HALF = ("apply_features", "validate_data", "materialize", "check_freshness", "train")
AFTER_THE_DATA_HALF = f"(?!(?:{'|'.join(DATA_HALF)})$).*"
# One training day (the interval itself): validate-data then checks the interval's two days, as by hand.
ONE_TRAINING_DAY = {"training_days": 1}
# The four corruptions the gates learned last, one per day of a three-day training window plus tonight.
CORRUPTED_DAYS = {
    date(2026, 11, 26): "republished_new_ids",
    date(2026, 11, 27): "packages_after_orders",
    date(2026, 11, 28): "feed_outage",
    date(2026, 11, 29): "appended_twice",
}
# Bad input of the contract kind on top, one table of one day each: judged from the parquet footer on both engines.
CONTRACT_BREAKS = {("routes", date(2026, 11, 26)): "schema", ("users", date(2026, 11, 27)): "naive_timestamps"}
STOPPED_BY = {
    "schema": r"routes\.distance_km date=2026-11-26: missing column distance_km",
    "naive_timestamps": r"users\.event_timestamp date=2026-11-27: type timestamp\[us\] has no",
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
            # The driver lives in this test process: stop it before its master goes, or it keeps retrying the
            # master (a third of a core) while the rest of the suite runs on this worker.
            _stop_this_process_session()


def _stop_this_process_session() -> None:
    """Stop the Spark session this test process holds, if any: it holds every core of the cluster (the YAML sets
    no spark.cores.max), so another application (a DAG step's) would wait for executors until it is gone."""
    from pyspark.sql import SparkSession

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
    # mlflow.set_tracking_uri exports the URI it was given: a step run in this process must not pick another
    # home's registry (its own, under MLRELEASE_HOME, is the default)
    for leaked in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        mp.delenv(leaked, raising=False)
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


def _online(settings: Settings) -> pd.DataFrame:
    """The feature service's online values of the interval's last 40 orders' entities (read from Redis)."""
    from mlrelease.feast_store import open_store

    orders = pd.read_parquet(settings.offline_dir / "orders" / "date=2026-11-28")
    rows = [
        {"user_id": int(r.user_id), "package_id": int(r.package_id), "route_id": int(r.route_id)}
        for r in orders.tail(40).itertuples()
    ]
    store = open_store(settings)
    return store.get_online_features(features=store.get_feature_service("parcel_eta_v1"), entity_rows=rows).to_df()


def _validation(settings: Settings) -> dict[str, Any]:
    """The night's validation report."""
    return dict(json.loads((settings.artifacts_dir / RUN_KEY / "data_quality" / "validation.json").read_text()))


def _data_half_in_process(settings: Settings) -> dict[str, Any]:
    """What the DAG's data-half tasks run, called in this process: validation, materialization, the training frame
    and the candidate trained on it (one training day, as the DAG is triggered below)."""
    from mlrelease.model.training_data import historical_frame
    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.train import train
    from mlrelease.steps.validate_data import validate_data

    apply_features(settings)
    validate_data(settings, TONIGHT, overlap=OVERLAP, **ONE_TRAINING_DAY)
    return {
        "materialized": materialize(settings, TONIGHT, OVERLAP),
        "training": historical_frame(settings, TONIGHT),  # train's frame: one training day is the interval
        "train": train(settings, TONIGHT, **ONE_TRAINING_DAY),
        "validation": _validation(settings),
        "online": _online(settings),
    }


def _data_half_by_the_dag(settings: Settings, db: Path, webhook: str) -> dict[str, Any]:
    """The nightly DAG's data half through `airflow dags test` (every step a process of its own)."""
    proc, outcomes = run_nightly_dag(
        settings.home, db, webhook, mark_success=AFTER_THE_DATA_HALF, conf=ONE_TRAINING_DAY
    )
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "state=success" in logs, logs[-4000:]
    assert {task: outcomes[task]["status"] for task in DATA_HALF} == dict.fromkeys(DATA_HALF, STATUS_SUCCESS)
    assert set(outcomes) == set(DATA_HALF)  # Airflow ran nothing past train
    return {
        "materialized": outcomes["materialize"]["result"],
        "train": outcomes["train"]["result"],
        "validation": _validation(settings),
        "online": _online(settings),
    }


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
            assert theirs["drift"][column]["psi"] == drift["psi"], (name, column)  # the same bins, counted exactly
        for ours, other in zip(mine["expectations"], theirs["expectations"], strict=True):
            assert (other["type"], other["column"], other["success"]) == (ours["type"], ours["column"], ours["success"])
            if ours["type"] != "expect_column_values_to_be_in_type_list":  # int64 on pandas is LongType on Spark
                assert _same_observed(other["observed"], ours["observed"]), (name, ours, other)


def _train_params(run_id: str, home: Path) -> dict[str, str]:
    """The train run's row counts and window, from the home's own MLflow store (the default under MLRELEASE_HOME)."""
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}").get_run(run_id).data.params
    return {k: params[k] for k in ("rows_fit", "rows_holdout", "training_start", "training_end", "features")}


def test_the_nightly_dags_data_half_on_the_cluster_gives_the_pandas_paths_results(
    cluster: LocalSparkCluster,
    clean_offline: Path,
    redis_url: str,
    migrated_airflow_db: Path,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    _stop_this_process_session()  # the DAG's step applications need the workers' cores
    results = {}
    for engine, settings in _each_engine(tmp_path, clean_offline, redis_url, cluster):
        if engine == "pandas":
            results[engine] = _data_half_in_process(settings)
        else:
            results[engine] = _data_half_by_the_dag(settings, migrated_airflow_db, receiver.url)
    # Each step that reads the data ran as its own application on the master, its jobs on both workers' executors
    # (a session that fell back to local mode would never show on the master's page).
    apps = {app["name"]: app["id"] for app in cluster.applications()}
    workers = sorted(w["id"] for w in cluster.alive_workers())
    for step in ("validate-data", "materialize", "training-frame"):
        app_id = apps.get(f"mlrelease parcel_eta {step}")
        assert app_id is not None, (step, apps)
        assert sorted({e.split("/")[0] for e in cluster.executors_of(app_id)}) == workers, (step, apps)
    pandas, spark = results["pandas"], results["spark"]
    assert spark["validation"]["engine"] == "spark" and pandas["validation"]["engine"] == "pandas"
    _same_report(pandas["validation"], spark["validation"])
    assert spark["materialized"]["views"].keys() == pandas["materialized"]["views"].keys()
    for view, loaded in pandas["materialized"]["views"].items():
        assert spark["materialized"]["views"][view]["rows_written"] == loaded["rows_written"] > 0
    pd.testing.assert_frame_equal(spark["online"][pandas["online"].columns], pandas["online"], check_dtype=False)
    # The same training frame: the same candidate, fitted with the same seed, scores the same on the same holdout.
    assert len(pandas["training"]) > 500
    assert spark["train"]["status"] == pandas["train"]["status"] == "registered as challenger"
    assert _train_params(spark["train"]["run_id"], tmp_path / "spark") == _train_params(
        pandas["train"]["run_id"], tmp_path / "pandas"
    )
    assert spark["train"]["metrics"].keys() == pandas["train"]["metrics"].keys()
    for name, value in pandas["train"]["metrics"].items():
        assert spark["train"]["metrics"][name] == pytest.approx(value, rel=1e-9), name


def _corrupt(offline: Path, scratch: Path) -> None:
    """Each day of CORRUPTED_DAYS rewritten with its own corruption (all four tables of that day), then each table
    of CONTRACT_BREAKS replaced by its broken version."""
    for day, mode in CORRUPTED_DAYS.items():
        generate(offline, day, day, rows_per_day=ROWS_PER_DAY, seed=11, inject=mode)
    for (table, day), mode in CONTRACT_BREAKS.items():
        generate(scratch / mode, day, day, rows_per_day=ROWS_PER_DAY, seed=11, inject=mode)
        shutil.copytree(scratch / mode / table, offline / table, dirs_exist_ok=True)


def test_four_corruptions_and_two_contract_breaks_are_stopped_with_the_same_lines_on_both_engines(
    cluster: LocalSparkCluster, clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    import redis

    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.validate_data import validate_data

    findings = {}
    for engine, settings in _each_engine(tmp_path, clean_offline, redis_url, cluster):
        apply_features(settings)
        _corrupt(settings.offline_dir, tmp_path / engine / "scratch")
        # An earlier night's entry stands in for the store's contents: a write, a delete or a flush all show.
        redis.Redis.from_url(f"redis://{redis_url}").set(b"mlrelease:earlier-night", b"features")
        before = redis_digest(redis_url)
        with pytest.raises(GateFailed) as stopped:
            validate_data(settings, TONIGHT, overlap=OVERLAP, training_days=3)
        assert "\n" not in str(stopped.value)
        with pytest.raises(StepError, match="materialize reads only validated source partitions"):
            materialize(settings, TONIGHT, OVERLAP)
        assert redis_digest(redis_url) == before  # nothing reached the online store
        findings[engine] = _validation(settings)["failures"]
    assert findings["spark"] == findings["pandas"]
    for mode, line in STOPPED_BY.items():
        assert any(re.search(line, f) for f in findings["spark"]), (mode, findings["spark"])


def test_a_missing_partition_is_the_same_error_on_both_engines(
    cluster: LocalSparkCluster, clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    from mlrelease.steps.validate_data import validate_data

    errors = {}
    for engine, settings in _each_engine(tmp_path, clean_offline, redis_url, cluster):
        shutil.rmtree(settings.offline_dir / "packages" / "date=2026-11-28")
        with pytest.raises(StepError) as missing:  # exit 2 on either engine: rerun once the extract has landed
            validate_data(settings, TONIGHT, overlap=OVERLAP)
        errors[engine] = str(missing.value).replace(str(settings.home), "<home>")
        assert not (settings.artifacts_dir / RUN_KEY / "data_quality").exists()
    assert errors["spark"] == errors["pandas"]
    assert errors["spark"].startswith("packages/date=2026-11-28: partition is missing (<home>/"), errors


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


def test_order_statistics_are_the_sorted_samples_values(
    cluster: LocalSparkCluster, clean_offline: Path, redis_url: str, tmp_path: Path
) -> None:
    # PSI's edges on Spark are numpy's, bit for bit, only if the fetched order statistics are the sorted values.
    from mlrelease.quality.spark_tables import order_statistics
    from mlrelease.spark.session import spark_session

    rng = np.random.default_rng(5)
    sample = np.round(rng.lognormal(1.0, 0.8, 5000), 1)  # long ties of one-decimal values
    with pytest.MonkeyPatch.context() as mp:
        session = spark_session(_home(tmp_path, clean_offline, mp, redis_url, "spark", cluster.master_url), "test")
        frame = session.createDataFrame(pd.DataFrame({"v": sample})).repartition(4)
        ranks = [0, 1, 499, 500, 2499, 2500, 4998, 4999]
        assert order_statistics(frame, "v", ranks) == {r: float(np.sort(sample)[r]) for r in ranks}
