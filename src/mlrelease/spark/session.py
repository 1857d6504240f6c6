"""The data half's engine, chosen by the Feast YAML: pandas, or Spark when its offline store is `spark`.

One configuration for both halves: `feature_store.spark.yaml`'s `offline_store.spark_conf` is the Spark
configuration that Feast's Spark offline store and engine read, and the one mlrelease builds the session from
for the GX gates. The session is built here, before Feast can build one: Feast 0.67's `spark.engine` hands
Spark its whole `batch_engine` block and drops a nested `spark_conf` (so `spark.master` would be silently ignored
and Spark would run in-process); with a session already active, Feast's offline store and engine reuse it.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from mlrelease.errors import StepError
from mlrelease.feast_store import config_mapping, offline_store_type
from mlrelease.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What the gates' hour-of-day and day-boundary logic needs of every session, whatever the YAML says.
REQUIRED_CONF = {"spark.sql.session.timeZone": "UTC"}
CONNECT_TIMEOUT_S = 5.0


def spark_conf(settings: Settings) -> dict[str, str] | None:
    """The YAML's `offline_store.spark_conf` when its offline store is Spark; None for the file (pandas) store."""
    offline = config_mapping(settings).get("offline_store") or {}
    if not isinstance(offline, dict) or offline.get("type") != "spark":
        return None
    conf = offline.get("spark_conf") or {}
    return {str(k): str(v) for k, v in conf.items()}


def data_engine(settings: Settings) -> str:
    """`spark` when the Feast YAML's offline store is Spark, else `pandas` (the embedded default)."""
    return "spark" if offline_store_type(settings) == "spark" else "pandas"


def start_engine(settings: Settings, purpose: str) -> SparkSession | None:
    """Before Feast reads the offline store: the Spark session on the configured master, or None on pandas."""
    return spark_session(settings, purpose) if data_engine(settings) == "spark" else None


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The host:port pairs of a standalone master URL (spark://h1:p1,h2:p2); [] for local[...] masters."""
    if master.startswith("local"):
        return []
    if not master.startswith("spark://"):
        raise StepError(f"spark.master {master!r} is not supported: use spark://HOST:PORT (or local[N] for a try-out)")
    pairs = []
    for part in master.removeprefix("spark://").split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise StepError(f"spark.master {master!r}: {part!r} is not HOST:PORT")
        pairs.append((host, int(port)))
    return pairs


def check_reachable(master: str) -> None:
    """Fail, naming the URL, unless some master address accepts a TCP connection (before anything is read)."""
    errors = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    if errors:
        raise StepError(f"the Spark master {master} cannot be reached ({'; '.join(errors)}); nothing was read")


def app_name(conf: dict[str, str], settings: Settings, purpose: str) -> str:
    """The application's name on the master's page: the YAML's `spark.app.name`, the model and the step."""
    model = settings.model or os.environ.get("MLRELEASE_MODEL", "")
    return " ".join(part for part in (conf.get("spark.app.name", "mlrelease"), model, purpose) if part)


def spark_session(settings: Settings, purpose: str) -> SparkSession:
    """The session on the configured master, built from the YAML's spark_conf; checked to run where it says.

    :param purpose: what the process reads it for (the step's name): part of the application's name, so an operator
        tells the night's applications apart on the master's page (one per step process).
    """
    conf = spark_conf(settings)
    if conf is None:
        raise StepError(f"{settings.feature_store_yaml} does not configure a Spark offline store")
    master = conf.get("spark.master", "")
    if not master:
        raise StepError(f"{settings.feature_store_yaml}: offline_store.spark_conf has no spark.master")
    check_reachable(master)
    from mlrelease.spark.cluster import java_home

    os.environ.setdefault("JAVA_HOME", java_home())
    # Executors run Python (Feast's online writes) with this interpreter unless the YAML names another; pyspark's
    # SparkContext reads PYSPARK_PYTHON, not the spark.pyspark.python setting.
    os.environ.setdefault("PYSPARK_PYTHON", conf.get("spark.pyspark.python", sys.executable))
    from pyspark.sql import SparkSession

    builder: Any = SparkSession.builder
    for key, value in {**conf, **REQUIRED_CONF, "spark.app.name": app_name(conf, settings, purpose)}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    running = session.sparkContext.master
    if running != master:
        raise StepError(
            f"this process already runs a Spark session on {running}, not the configured {master}; "
            "start the step in a new process"
        )
    for key, value in REQUIRED_CONF.items():
        session.conf.set(key, value)
    return session
