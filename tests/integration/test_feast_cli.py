"""The real `feast` CLI on the feature repo as it is: nothing to export, and a removed view leaves the registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlrelease.feast_store import open_store
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.steps.apply_features import apply_features

pytestmark = pytest.mark.integration
FEAST = Path(sys.executable).parent / "feast"  # the venv's CLI, as a user runs it
VIEWS = {"user_features", "package_features", "route_features"}


def _feast(clone: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`feast -c feature_repo ARGS` in the clone, with no mlrelease or Feast variable unless `env` adds it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLRELEASE_", "FEAST_", "FEATURE_REPO_DIR"))}
    done = subprocess.run(
        [str(FEAST), "-c", "feature_repo", *args],
        cwd=clone,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"feast {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _drop_route_features(repo: Path) -> None:
    """Remove route_features, its entity and the feature service that reads it (they come last in features.py)."""
    source = (repo / "features.py").read_text()
    source = source[: source.index("route_features = FeatureView(")]
    lines = [line for line in source.splitlines() if not line.startswith("route = Entity(")]
    (repo / "features.py").write_text("\n".join(lines) + "\n")


@pytest.fixture
def clone(tmp_path: Path, clean_offline: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean clone's feature repo with its default home `.mlrelease` next to it, holding data, as after `make run`.

    The steps run as `make run` runs them (MLRELEASE_HOME=<clone>/.mlrelease); the CLI gets no variable at all.
    """
    clone = tmp_path / "clone"
    shutil.copytree(REPO_ROOT / "feature_repo", clone / "feature_repo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(clean_offline, clone / ".mlrelease/data/offline")
    monkeypatch.setenv("MLRELEASE_HOME", str(clone / ".mlrelease"))
    monkeypatch.setenv("MLRELEASE_FEATURE_REPO", str(clone / "feature_repo"))
    monkeypatch.delenv("FEAST_FS_YAML_FILE_PATH", raising=False)
    monkeypatch.chdir(tmp_path)  # apply changes directory like `feast apply`; restore it afterwards
    return clone


def test_feast_plan_and_apply_work_on_the_repo_as_it_is(clone):
    settings = Settings.from_env()
    assert set(apply_features(settings)["feature_views"]) == VIEWS  # what `make run` leaves in the registry

    plan = _feast(clone, "plan")
    assert "No changes to registry" in plan  # the CLI reads the registry the steps wrote, sources included
    assert set(_feast(clone, "feature-views", "list").split()) >= VIEWS

    _drop_route_features(clone / "feature_repo")
    plan = _feast(clone, "plan")
    assert "Deleted feature view route_features" in plan
    assert {fv.name for fv in open_store(settings).list_feature_views()} == VIEWS, "plan changes nothing"
    _feast(clone, "apply")

    assert "route_features" not in _feast(clone, "feature-views", "list")
    # The store the steps open is the one the CLI changed.
    assert {fv.name for fv in open_store(settings).list_feature_views()} == VIEWS - {"route_features"}
    assert [fs.name for fs in open_store(settings).list_feature_services()] == []


def test_production_yaml_sql_registry_is_shared_by_steps_and_cli(clone, redis_url, tmp_path, monkeypatch):
    """feature_store.production.yaml for real: a SQL registry (SQLite here, Postgres in production) and Redis."""
    production = {
        "FEAST_FS_YAML_FILE_PATH": str(clone / "feature_repo/feature_store.production.yaml"),
        "MLRELEASE_FEAST_REGISTRY_URL": f"sqlite:///{tmp_path / 'feast_registry.db'}",
        "MLRELEASE_REDIS_URL": redis_url,
        "MLRELEASE_HOME": str(clone / ".mlrelease"),  # the pod's state volume: where the offline tables are
    }
    for name, value in production.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MLRELEASE_ONLINE_STORE", "redis")
    settings = Settings.from_env()
    assert set(apply_features(settings)["feature_views"]) == VIEWS
    assert not (clone / ".mlrelease/feast/registry.db").exists(), "no registry file: the SQL registry holds it"

    assert "No changes to registry" in _feast(clone, "plan", env=production)

    _drop_route_features(clone / "feature_repo")
    result = apply_features(settings, specs=())  # no model reads it here (the declared ones would refuse the shrink)
    assert result["removed"]["feature_views"] == ["route_features"]
    assert "route_features" not in _feast(clone, "feature-views", "list", env=production)
    assert {fv.name for fv in open_store(settings).list_feature_views()} == VIEWS - {"route_features"}
