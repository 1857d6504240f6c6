"""The Feast YAMLs as Feast reads them: the CLI needs no variable; mlrelease moves local state to its home."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlrelease.feast_store import home_path, repo_config
from mlrelease.settings import REPO_ROOT, Settings

FEATURE_REPO = REPO_ROOT / "feature_repo"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("MLRELEASE_HOME", "MLRELEASE_FEATURE_REPO", "MLRELEASE_ONLINE_STORE", "FEAST_FS_YAML_FILE_PATH"):
        monkeypatch.delenv(name, raising=False)


def test_the_default_yaml_needs_no_variable_and_points_at_the_default_home():
    """What `feast -c feature_repo …` reads: relative paths that Feast resolves to <repo>/.mlrelease."""
    from feast.infra.registry.file import FileRegistryStore
    from feast.repo_config import load_repo_config

    yaml_path = FEATURE_REPO / "feature_store.yaml"
    assert "${" not in yaml_path.read_text()
    config = load_repo_config(FEATURE_REPO, yaml_path)  # exactly as the CLI loads it
    store = FileRegistryStore(config.registry, FEATURE_REPO)
    assert store._filepath.resolve() == REPO_ROOT / ".mlrelease/feast/registry.db"
    assert (FEATURE_REPO / config.online_store.path).resolve() == REPO_ROOT / ".mlrelease/feast/online_store.db"
    # With no MLRELEASE_HOME, mlrelease's store is the CLI's store.
    default = repo_config(Settings.from_env())
    assert Path(default.registry.path) == REPO_ROOT / ".mlrelease/feast/registry.db"
    assert Path(default.online_store.path) == REPO_ROOT / ".mlrelease/feast/online_store.db"


def test_mlrelease_moves_local_state_to_its_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    config = repo_config(settings)
    assert config.registry.registry_type == "file" and config.repo_path == FEATURE_REPO
    assert config.registry.path == str(tmp_path / "home/feast/registry.db")
    assert config.online_store.path == str(tmp_path / "home/feast/online_store.db")
    # Only paths under the YAML's default home move: URIs and other places stay as written.
    assert home_path(settings, "s3://bucket/registry.db") == "s3://bucket/registry.db"
    assert home_path(settings, "data/registry.db") == "data/registry.db"
    assert home_path(settings, "/srv/feast/registry.db") == "/srv/feast/registry.db"


def test_a_copy_of_the_repo_keeps_its_home_next_to_it(tmp_path, monkeypatch):
    """A feature repo elsewhere: its YAML's `../.mlrelease` is moved to MLRELEASE_HOME all the same."""
    import shutil

    repo = tmp_path / "clone" / "feature_repo"
    shutil.copytree(FEATURE_REPO, repo)
    monkeypatch.setenv("MLRELEASE_FEATURE_REPO", str(repo))
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path / "elsewhere"))
    assert repo_config(Settings.from_env()).registry.path == str(tmp_path / "elsewhere/feast/registry.db")


def test_redis_yaml_takes_the_address_from_the_environment(monkeypatch):
    monkeypatch.setenv("MLRELEASE_ONLINE_STORE", "redis")
    monkeypatch.setenv("MLRELEASE_REDIS_URL", "redis.example:6380")
    settings = Settings.from_env()
    assert settings.feature_store_yaml == FEATURE_REPO / "feature_store.redis.yaml"
    config = repo_config(settings)
    assert config.online_store.type == "redis" and config.online_store.connection_string == "redis.example:6380"
    assert config.registry.path == str(REPO_ROOT / ".mlrelease/feast/registry.db")


def test_production_yaml_is_a_sql_registry_from_the_environment(monkeypatch):
    """Parsed by Feast's RepoConfig, as the CLI (FEAST_FS_YAML_FILE_PATH) and the steps read it."""
    from feast.infra.registry.sql import SqlRegistryConfig
    from feast.repo_config import load_repo_config

    yaml_path = FEATURE_REPO / "feature_store.production.yaml"
    monkeypatch.setenv("MLRELEASE_FEAST_REGISTRY_URL", "postgresql+psycopg://feast:secret@postgres.db:5432/feast")
    monkeypatch.setenv("MLRELEASE_REDIS_URL", "redis.mlrelease.svc:6379")
    monkeypatch.setenv("FEAST_FS_YAML_FILE_PATH", str(yaml_path))
    settings = Settings.from_env()
    assert settings.feature_store_yaml == yaml_path  # Feast's variable selects the file for mlrelease too
    for config in (load_repo_config(FEATURE_REPO, yaml_path), repo_config(settings)):
        registry = config.registry
        assert isinstance(registry, SqlRegistryConfig) and registry.registry_type == "sql"
        assert registry.path == "postgresql+psycopg://feast:secret@postgres.db:5432/feast"  # as written, not moved
        assert registry.sqlalchemy_config_kwargs == {"echo": False, "pool_pre_ping": True}
        assert config.online_store.type == "redis"
        assert config.online_store.connection_string == "redis.mlrelease.svc:6379"
        assert config.project == "mlrelease"

    # A bare postgresql:// URL is pinned to psycopg 3 (the driver the step image has) by Feast itself.
    monkeypatch.setenv("MLRELEASE_FEAST_REGISTRY_URL", "postgresql://feast@postgres.db/feast")
    assert repo_config(settings).registry.path == "postgresql+psycopg://feast@postgres.db/feast"


def test_a_relative_feast_yaml_variable_is_resolved_once(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setenv("FEAST_FS_YAML_FILE_PATH", "feature_repo/feature_store.production.yaml")
    settings = Settings.from_env()
    monkeypatch.chdir(tmp_path)  # steps change directory (apply does, like `feast apply`)
    assert settings.feature_store_yaml == FEATURE_REPO / "feature_store.production.yaml"
