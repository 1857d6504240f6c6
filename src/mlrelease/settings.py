"""Runtime settings read from the environment: where state lives and which stores to use."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    """Resolved paths and backends for one process; build it with `Settings.from_env()`."""

    home: Path
    feature_repo: Path
    online_store: str
    redis_url: str
    xcom_path: Path
    # Feast's own FEAST_FS_YAML_FILE_PATH (the `feast` CLI reads it too): production points it at
    # feature_store.production.yaml; unset, the online store picks the YAML (see `feature_store_yaml`).
    feast_yaml_override: Path | None = None
    # The model whose artifacts these settings locate; None: the one this process releases (MLRELEASE_MODEL).
    # Set by processes that serve several models' runs (Airflow's own: a DAG's runner, the report plugin).
    model: str | None = None
    # How a rollout moves and observes traffic (rollout/traffic_router_factory.py, metrics_source_factory.py) and
    # the configs the steps read; read here once, so the factories take them as arguments.
    traffic_router: str = "gateway"  # MLRELEASE_TRAFFIC_ROUTER: gateway | httproute
    metrics_source: str = "decision_log"  # MLRELEASE_METRICS_SOURCE: decision_log | prometheus
    prometheus_url: str = ""  # MLRELEASE_PROMETHEUS_URL (the prometheus source)
    prometheus_selector: str = ""  # MLRELEASE_PROMETHEUS_SELECTOR: extra matchers for the gateway's series
    gateway_config: Path | None = None  # MLRELEASE_GATEWAY_CONFIG; None: config/gateway.yaml
    httproute_config: Path | None = None  # MLRELEASE_HTTPROUTE_CONFIG (mounted in httproute mode); None: none mounted
    # Where the steps report: a webhook for gate overrides, the report's served base URL, the Pushgateway.
    alert_webhook: str = ""  # MLRELEASE_ALERT_WEBHOOK
    report_base_url: str = ""  # MLRELEASE_REPORT_BASE_URL; "": file:// links
    pushgateway_url: str = ""  # MLRELEASE_PUSHGATEWAY_URL (validated where it is used)

    @classmethod
    def from_env(cls) -> Settings:
        """Read MLRELEASE_* variables, falling back to the embedded defaults under the repo."""
        home = Path(os.environ.get("MLRELEASE_HOME", REPO_ROOT / ".mlrelease")).resolve()
        online_store = os.environ.get("MLRELEASE_ONLINE_STORE", "sqlite")
        feast_yaml = os.environ.get("FEAST_FS_YAML_FILE_PATH", "").strip()
        if online_store not in ("sqlite", "redis"):
            raise ValueError(f"MLRELEASE_ONLINE_STORE must be 'sqlite' or 'redis', got {online_store!r}")
        return cls(
            home=home,
            feature_repo=Path(os.environ.get("MLRELEASE_FEATURE_REPO", REPO_ROOT / "feature_repo")).resolve(),
            online_store=online_store,
            redis_url=os.environ.get("MLRELEASE_REDIS_URL", "127.0.0.1:6379"),
            xcom_path=Path(os.environ.get("MLRELEASE_XCOM_PATH", "/airflow/xcom/return.json")),
            feast_yaml_override=Path(feast_yaml).resolve() if feast_yaml else None,
            traffic_router=os.environ.get("MLRELEASE_TRAFFIC_ROUTER", "gateway"),
            metrics_source=os.environ.get("MLRELEASE_METRICS_SOURCE", "decision_log"),
            prometheus_url=os.environ.get("MLRELEASE_PROMETHEUS_URL", "").strip(),
            prometheus_selector=os.environ.get("MLRELEASE_PROMETHEUS_SELECTOR", "").strip(),
            gateway_config=_path_or_none("MLRELEASE_GATEWAY_CONFIG"),
            httproute_config=_path_or_none("MLRELEASE_HTTPROUTE_CONFIG"),
            alert_webhook=os.environ.get("MLRELEASE_ALERT_WEBHOOK", "").strip(),
            report_base_url=os.environ.get("MLRELEASE_REPORT_BASE_URL", "").strip(),
            pushgateway_url=os.environ.get("MLRELEASE_PUSHGATEWAY_URL", "").strip(),
        )

    def for_model(self, model: str) -> Settings:
        """These settings for model `model`'s artifacts (in a process that is not bound to one model)."""
        return replace(self, model=model)

    @property
    def offline_dir(self) -> Path:
        """Directory holding the date-partitioned parquet tables (the offline store's sources)."""
        return self.home / "data" / "offline"

    @property
    def release_model(self) -> str:
        """The model these settings are for: the one set by `for_model`, else the one this process releases."""
        from mlrelease.release_spec import process_spec  # lazy: settings is a foundation, read by light commands

        return self.model or process_spec().name

    @property
    def artifacts_dir(self) -> Path:
        """Step artifacts (outcomes, validation reports, metrics files) of the model this process releases.

        One folder per model: two models' nightly runs share a data interval, so a run key alone would let one
        model's recorded outcome answer for the other's retried step.
        """
        return self.home / "artifacts" / self.release_model

    @property
    def feature_store_yaml(self) -> Path:
        """The Feast config file: FEAST_FS_YAML_FILE_PATH when set, else the one for the chosen online store."""
        if self.feast_yaml_override is not None:
            return self.feast_yaml_override
        name = "feature_store.yaml" if self.online_store == "sqlite" else "feature_store.redis.yaml"
        return self.feature_repo / name

    def feast_env(self) -> dict[str, str]:
        """Variables the Feast repo's sources (features.py) and the Redis YAMLs read from the environment."""
        return {
            "MLRELEASE_HOME": str(self.home),
            "MLRELEASE_REDIS_URL": self.redis_url,
        }


def _path_or_none(variable: str) -> Path | None:
    """The absolute path an environment variable names (unset or empty: None)."""
    value = os.environ.get(variable, "").strip()
    return Path(value).resolve() if value else None
