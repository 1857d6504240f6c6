"""Opening the Feast repository with the settings of this process.

The repo's YAMLs name local state with paths relative to the feature repo, under `../.mlrelease` (the default
MLRELEASE_HOME next to it), so the `feast` CLI works on `feature_repo/` as it is. mlrelease loads the same YAML
into Feast's RepoConfig and moves those paths onto its own MLRELEASE_HOME (a test's home, a pod's state volume).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from mlrelease.errors import StepError
from mlrelease.settings import Settings

if TYPE_CHECKING:
    from feast import FeatureStore
    from feast.repo_config import RepoConfig

# Where the YAMLs' relative paths put local state: the default MLRELEASE_HOME, next to the feature repo.
YAML_HOME = ".mlrelease"
_VARIABLE = re.compile(r"\$(\w+|\{([^}]*)\})")  # os.path.expandvars' pattern: $VAR or ${VAR}; unknown ones stay


def quiet_feast_logs() -> None:
    """Silence dask/pandas deprecation chatter so a step's output stays readable."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("feast").setLevel(logging.WARNING)


def export_feast_env(settings: Settings) -> None:
    """Put the variables the Feast YAML and repo files expand into this process's environment.

    MLRELEASE_DATA_ENGINE tells features.py which kind of source to declare for the same parquet tables:
    FileSource for the file offline store (pandas), SparkSource for the Spark one.
    """
    os.environ.update(settings.feast_env())
    os.environ["MLRELEASE_DATA_ENGINE"] = "spark" if offline_store_type(settings) == "spark" else "pandas"


def offline_store_type(settings: Settings) -> str:
    """The chosen YAML's `offline_store.type` (`file` when it names none, as Feast defaults)."""
    offline = config_mapping(settings).get("offline_store")
    return str(offline.get("type", "file")) if isinstance(offline, dict) else "file"


def home_path(settings: Settings, path: str) -> str:
    """`path` from the YAML, moved onto settings.home when it lies under the YAML's default home; else unchanged.

    A relative path is resolved as Feast resolves it (against the feature repo); URIs and absolute paths
    outside the default home are left alone.
    """
    if "://" in path or not path:
        return path
    resolved = (settings.feature_repo / path).resolve()
    try:
        inside = resolved.relative_to((settings.feature_repo.parent / YAML_HOME).resolve())
    except ValueError:
        return path
    return str(settings.home / inside)


def config_mapping(settings: Settings) -> dict[str, Any]:
    """The chosen YAML as Feast reads it (${VAR}s expanded), with the paths of local state under settings.home.

    The file registry's path and the SQLite online store's path are the ones that hold state; a SQL registry
    or a Redis online store is left exactly as the YAML (and its ${VAR}s) says. Written to a file, it is a YAML
    the `feast` CLI can use (`-f`) for a home other than the repo's default one.
    """
    import yaml

    path = settings.feature_store_yaml
    # As feast.repo_config.load_repo_config (os.path.expandvars, then parsed), with this process's settings
    # (MLRELEASE_REDIS_URL…) over the environment: what open_store exports before Feast reads anything.
    variables = {**os.environ, **settings.feast_env()}
    text = _VARIABLE.sub(lambda m: variables.get(m.group(2) or m.group(1), m.group(0)), path.read_text("utf-8"))
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise StepError(f"feature repo config {path} is not a mapping")
    registry = raw.get("registry")
    if isinstance(registry, str):  # the shorthand `registry: <path>` is a file registry
        raw["registry"] = home_path(settings, registry)
    elif isinstance(registry, dict) and registry.get("registry_type", "file") == "file":
        registry["path"] = home_path(settings, str(registry.get("path", "")))
    online = raw.get("online_store")
    if isinstance(online, dict) and online.get("type") == "sqlite" and "path" in online:
        online["path"] = home_path(settings, str(online["path"]))
    return raw


def repo_config(settings: Settings) -> RepoConfig:
    """Feast's RepoConfig of the chosen YAML, loaded as Feast loads it, with local state under settings.home."""
    from feast.repo_config import RepoConfig

    config = RepoConfig(**config_mapping(settings))
    config.repo_path = settings.feature_repo
    return config


def open_store(settings: Settings) -> FeatureStore:
    """A FeatureStore for the repo and YAML chosen in `settings`, its local state under settings.home."""
    quiet_feast_logs()
    export_feast_env(settings)
    from feast import FeatureStore

    if not settings.feature_store_yaml.is_file():
        raise StepError(f"feature repo config {settings.feature_store_yaml} does not exist")
    try:
        return FeatureStore(repo_path=str(settings.feature_repo), config=repo_config(settings))
    except Exception as exc:  # Feast raises many types for a bad config; name the file either way.
        raise StepError(f"feature repo config {settings.feature_store_yaml} is invalid: {exc}") from None
