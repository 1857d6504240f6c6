"""The Spark configuration of the data half: which engine a YAML selects, the master URL, what Spark cannot read."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from mlrelease.errors import StepError
from mlrelease.quality.spark_tables import spark_problems
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.spark.cluster import free_port
from mlrelease.spark.session import check_reachable, data_engine, master_addresses, spark_conf

SPARK_YAML = REPO_ROOT / "feature_repo" / "feature_store.spark.yaml"


@pytest.fixture
def spark_settings(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings on feature_store.spark.yaml with its variables set."""
    monkeypatch.setenv("FEAST_FS_YAML_FILE_PATH", str(SPARK_YAML))
    monkeypatch.setenv("MLRELEASE_SPARK_MASTER", "spark://10.0.0.5:7077")
    monkeypatch.setenv("MLRELEASE_FEAST_REGISTRY_URL", f"sqlite:///{home}/registry.db")
    monkeypatch.setenv("MLRELEASE_REDIS_URL", "127.0.0.1:6379")
    return Settings.from_env()


def test_the_feast_yaml_selects_the_engine_and_carries_the_spark_configuration(
    home: Path, spark_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = spark_conf(spark_settings)
    assert data_engine(spark_settings) == "spark" and conf is not None
    assert conf["spark.master"] == "spark://10.0.0.5:7077"  # ${MLRELEASE_SPARK_MASTER}, expanded
    assert conf["spark.sql.session.timeZone"] == "UTC"
    monkeypatch.delenv("FEAST_FS_YAML_FILE_PATH")
    embedded = Settings.from_env()
    assert data_engine(embedded) == "pandas" and spark_conf(embedded) is None


def test_the_spark_yaml_is_a_valid_feast_config_with_the_spark_store_and_engine(spark_settings: Settings) -> None:
    from mlrelease.feast_store import repo_config

    config = repo_config(spark_settings)
    assert config.offline_store.type == "spark" and config.batch_engine.type == "spark.engine"
    assert config.online_store.type == "redis" and config.registry.registry_type == "sql"


def test_features_declare_one_source_per_table_for_either_offline_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from feast import FileSource
    from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource

    paths = {}
    for engine, kind in (("pandas", FileSource), ("spark", SparkSource)):
        monkeypatch.setenv("MLRELEASE_DATA_ENGINE", engine)
        views = runpy.run_path(str(REPO_ROOT / "feature_repo" / "features.py"))
        sources = {name: v.batch_source for name, v in views.items() if name.endswith("_features")}
        assert sources and all(isinstance(s, kind) for s in sources.values())
        paths[engine] = {name: (s.name, s.path, s.timestamp_field) for name, s in sources.items()}
    assert paths["spark"] == paths["pandas"]


def test_master_urls_are_parsed_or_refused_with_the_url_named() -> None:
    assert master_addresses("spark://a:7077,b:7078") == [("a", 7077), ("b", 7078)]
    assert master_addresses("local[2]") == []  # in-process: a try-out, nothing to reach
    with pytest.raises(StepError, match=r"spark\.master 'yarn' is not supported"):
        master_addresses("yarn")
    with pytest.raises(StepError, match=r"'a:port' is not HOST:PORT"):
        master_addresses("spark://a:port")
    url = f"spark://127.0.0.1:{free_port()}"
    with pytest.raises(StepError, match=rf"the Spark master {url} cannot be reached \(127\.0\.0\.1:\d+: .*\)"):
        check_reachable(url)


def test_spark_refuses_nanosecond_timestamps_by_name() -> None:
    fields = [pa.field("order_id", pa.int64()), pa.field("event_timestamp", pa.timestamp("ns", tz="UTC"))]
    assert spark_problems(pa.schema(fields)) == [
        (
            "event_timestamp",
            "type timestamp[ns, tz=UTC] has nanoseconds, which Spark cannot read; write timestamp[us] "
            "(as Spark and Hive do)",
        )
    ]
    assert spark_problems(pa.schema([fields[0], pa.field("event_timestamp", pa.timestamp("us", tz="UTC"))])) == []


def test_a_daemon_started_for_the_cluster_dies_with_the_process_that_started_it():
    # LocalSparkCluster's daemons run in their own sessions; a SIGKILLed test run must not leave them behind.
    script = (
        "import os, subprocess, time\n"
        "from mlrelease.spark.cluster import terminate_with_parent\n"
        "arm = terminate_with_parent(os.getpid())\n"
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True, preexec_fn=arm)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    daemon = psutil.Process(int(parent.stdout.readline()))
    assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
    parent.kill()
    parent.wait()
    try:
        daemon.wait(timeout=10)  # reaped by init, or a zombie nobody reaps: either way it no longer runs
    except psutil.TimeoutExpired:
        assert daemon.status() == psutil.STATUS_ZOMBIE
